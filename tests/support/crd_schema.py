"""Validate objects against a CRD's openAPIV3Schema the way the API server would, offline.

`jsonschema` checks the JSON-Schema part once the Kubernetes dialect is translated
(`nullable`, `x-kubernetes-int-or-string`); the Kubernetes-only parts are checked here:
list-map key uniqueness (`x-kubernetes-list-type: map`), unknown fields (refused, as
`kubectl --validate=strict` does, except under `x-kubernetes-preserve-unknown-fields`) and the
CEL rules of `x-kubernetes-validations` (through cel-python; transition rules only when an old
object is given).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from support.paths import DEPLOY

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})\Z")
FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    if not isinstance(value, str) or not _RFC3339.match(value):
        return False
    datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    return True


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crd(plural: str) -> dict[str, Any]:
    for doc in load_yaml_docs(DEPLOY / "crd" / f"{plural}.yaml"):
        if doc["kind"] == "CustomResourceDefinition":
            return doc
    raise AssertionError(f"no CRD in deploy/crd/{plural}.yaml")


def version_schema(definition: Mapping[str, Any], version: str) -> dict[str, Any]:
    for v in definition["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(f"no version {version}")


def to_json_schema(node: Mapping[str, Any], *, strict: bool = True) -> dict[str, Any]:
    """The openAPIV3Schema node as plain JSON Schema (recursively)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {k: to_json_schema(v, strict=strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = to_json_schema(value, strict=strict)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [to_json_schema(v, strict=strict) for v in value]
        else:
            out[key] = value
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if node.get("x-kubernetes-int-or-string") and "type" not in out:
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if strict and "properties" in node and "additionalProperties" not in node and not preserve:
        out["additionalProperties"] = False
    return out


def _walk(
    schema: Mapping[str, Any], value: Any, path: str
) -> Iterator[tuple[Mapping[str, Any], Any, str]]:
    yield schema, value, path
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                yield from _walk(props[key], item, f"{path}.{key}" if path else key)
            elif isinstance(extra, Mapping):
                yield from _walk(extra, item, f"{path}[{key!r}]")
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from _walk(schema["items"], item, f"{path}[{i}]")


def _cel_value(value: Any) -> Any:
    import celpy

    return celpy.json_to_cel(value)


def cel_rule_holds(
    rule: str, self_value: Any, old_value: Any = None, *, variables: Mapping[str, Any] | None = None
) -> bool:
    """Whether the CEL expression holds for `self` (and `oldSelf`, and other variables)."""
    import celpy

    env = celpy.Environment()
    program = env.program(env.compile(rule))
    activation: dict[str, Any] = {"self": _cel_value(self_value)}
    if old_value is not None:
        activation["oldSelf"] = _cel_value(old_value)
    for name, value in (variables or {}).items():
        activation[name] = _cel_value(value)
    return bool(program.evaluate(activation))


def errors(
    schema: Mapping[str, Any], obj: Any, *, old: Any = None, strict: bool = True
) -> list[str]:
    """Every reason the API server (with strict field validation) would refuse `obj`."""
    found = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in jsonschema.Draft7Validator(
            to_json_schema(schema, strict=strict), format_checker=FORMATS
        ).iter_errors(obj)
    ]
    old_by_path = {p: v for _, v, p in _walk(schema, old, "")} if old is not None else {}
    for node, value, path in _walk(schema, obj, ""):
        if node.get("x-kubernetes-list-type") == "map" and isinstance(value, list):
            keys = node.get("x-kubernetes-list-map-keys", [])
            seen: set[tuple[Any, ...]] = set()
            for item in value:
                if not isinstance(item, dict):
                    continue
                key = tuple(repr(item.get(k)) for k in keys)
                if key in seen:
                    found.append(f"{path}: duplicate entries for keys {keys} = {key}")
                seen.add(key)
        for rule in node.get("x-kubernetes-validations", []):
            transition = "oldSelf" in rule["rule"]
            if transition and path not in old_by_path:
                continue
            old_value = old_by_path.get(path) if transition else None
            if not cel_rule_holds(rule["rule"], value, old_value):
                found.append(f"{path}: {rule.get('message', rule['rule'])}")
    return found
