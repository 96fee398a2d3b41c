"""A custom resource's `openAPIV3Schema` applied as the API server applies it on every write:
defaults filled in, unknown fields pruned (kept under `x-kubernetes-preserve-unknown-fields`
and `additionalProperties`), then validated. Errors are field errors with the server's wording
(`spec.replicas: Invalid value: "x": spec.replicas in body must be of type integer: "string"`).

Not implemented: CEL rules (`x-kubernetes-validations`), `format` checks, `not`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

#: ObjectMeta fields that survive pruning of a custom resource's metadata.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)


@dataclass(frozen=True)
class FieldError:
    """One cause of a 422 Invalid answer."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, ...
    detail: str

    @property
    def message(self) -> str:
        return f"{self.field}: {self.detail}"

    def cause(self) -> Obj:
        return {"reason": self.reason, "message": self.detail, "field": self.field}


def show(value: Any) -> str:
    """A value as field errors print it."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return '"null"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return str(value)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """Fill in `default` values below `value` (returns the possibly new value)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if (
                key not in value or (value[key] is None and not sub.get("nullable"))
            ) and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key in list(value):
                if key not in props:
                    value[key] = apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def prune(
    value: Any, schema: Mapping[str, Any], path: str, dropped: list[str], *, root: bool = False
) -> Any:
    """Remove the fields the schema does not declare; records the pruned paths in `dropped`."""
    if isinstance(value, dict):
        embedded = root or schema.get("x-kubernetes-embedded-resource")
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        for key in list(value):
            if embedded and key in ("apiVersion", "kind"):
                continue
            if embedded and key == "metadata":
                meta = value[key]
                if isinstance(meta, dict):
                    for mkey in list(meta):
                        if mkey not in OBJECT_META_FIELDS:
                            dropped.append(_join(_join(path, "metadata"), mkey))
                            del meta[mkey]
                continue
            if key in props:
                value[key] = prune(value[key], props[key], _join(path, key), dropped)
            elif isinstance(extra, Mapping):
                value[key] = prune(value[key], extra, _join(path, key), dropped)
            elif extra is True or preserve:
                continue
            else:
                dropped.append(_join(path, key))
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [
            prune(item, schema["items"], f"{path}[{i}]", dropped) for i, item in enumerate(value)
        ]
    return value


def validate(value: Any, schema: Mapping[str, Any], path: str = "") -> list[FieldError]:
    """Field errors of `value` against a structural schema (empty when valid)."""
    errors: list[FieldError] = []
    _validate(value, schema, path, errors)
    return errors


def _type_ok(value: Any, schema: Mapping[str, Any]) -> bool:
    want = schema.get("type")
    got = _json_type(value)
    if value is None:
        return bool(schema.get("nullable"))
    if schema.get("x-kubernetes-int-or-string"):
        return got in ("integer", "string")
    if not want:
        return True
    if want == "number":
        return got in ("integer", "number")
    return bool(want == got)


def _validate(value: Any, schema: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    shown = path or "<root>"
    if not _type_ok(value, schema):
        want = "string" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
        errors.append(
            FieldError(
                shown,
                "FieldValueTypeInvalid",
                f"Invalid value: {show(value)}: {shown} in body must be of type "
                f'{want}: "{_json_type(value)}"',
            )
        )
        return
    if value is None:
        return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(show(v) for v in schema["enum"])
        errors.append(
            FieldError(
                shown,
                "FieldValueNotSupported",
                f"Unsupported value: {show(value)}: supported values: {allowed}",
            )
        )
    if isinstance(value, bool):
        pass
    elif isinstance(value, (int, float)):
        _numbers(value, schema, shown, errors)
    elif isinstance(value, str):
        _strings(value, schema, shown, errors)
    elif isinstance(value, list):
        _arrays(value, schema, path, errors)
    elif isinstance(value, dict):
        _objects(value, schema, path, errors)
    for sub in schema.get("allOf") or []:
        _validate(value, sub, path, errors)
    for combo, need in (("anyOf", 1), ("oneOf", 1)):
        options = schema.get(combo)
        if options:
            passing = sum(1 for sub in options if not validate(value, sub, path))
            if passing < need or (combo == "oneOf" and passing > 1):
                errors.append(
                    FieldError(
                        shown,
                        "FieldValueInvalid",
                        f"Invalid value: {show(value)}: {shown} in body must "
                        f"validate {'one and only one' if combo == 'oneOf' else 'at least one'}"
                        f" schema ({combo})",
                    )
                )


def _numbers(value: float, schema: Mapping[str, Any], shown: str, errors: list[FieldError]) -> None:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None:
        if schema.get("exclusiveMinimum") and value <= low:
            errors.append(
                FieldError(
                    shown,
                    "FieldValueInvalid",
                    f"Invalid value: {show(value)}: {shown} in body should be greater than {low}",
                )
            )
        elif value < low:
            errors.append(
                FieldError(
                    shown,
                    "FieldValueInvalid",
                    f"Invalid value: {show(value)}: {shown} in body should be "
                    f"greater than or equal to {low}",
                )
            )
    if high is not None:
        if schema.get("exclusiveMaximum") and value >= high:
            errors.append(
                FieldError(
                    shown,
                    "FieldValueInvalid",
                    f"Invalid value: {show(value)}: {shown} in body should be less than {high}",
                )
            )
        elif value > high:
            errors.append(
                FieldError(
                    shown,
                    "FieldValueInvalid",
                    f"Invalid value: {show(value)}: {shown} in body should be "
                    f"less than or equal to {high}",
                )
            )
    step = schema.get("multipleOf")
    if step and (value / step) != int(value / step):
        errors.append(
            FieldError(
                shown,
                "FieldValueInvalid",
                f"Invalid value: {show(value)}: {shown} in body should be a multiple of {step}",
            )
        )


def _strings(value: str, schema: Mapping[str, Any], shown: str, errors: list[FieldError]) -> None:
    pattern = schema.get("pattern")
    if pattern is not None and not re.search(pattern, value):
        errors.append(
            FieldError(
                shown,
                "FieldValueInvalid",
                f"Invalid value: {show(value)}: {shown} in body should match '{pattern}'",
            )
        )
    if schema.get("maxLength") is not None and len(value) > schema["maxLength"]:
        errors.append(
            FieldError(
                shown,
                "FieldValueTooLong",
                f"Too long: may not be more than {schema['maxLength']} bytes",
            )
        )
    if schema.get("minLength") is not None and len(value) < schema["minLength"]:
        errors.append(
            FieldError(
                shown,
                "FieldValueInvalid",
                f"Invalid value: {show(value)}: {shown} in body should be at least"
                f" {schema['minLength']} chars long",
            )
        )


def _arrays(
    value: list[Any], schema: Mapping[str, Any], path: str, errors: list[FieldError]
) -> None:
    shown = path or "<root>"
    if schema.get("maxItems") is not None and len(value) > schema["maxItems"]:
        errors.append(
            FieldError(
                shown,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
            )
        )
    if schema.get("minItems") is not None and len(value) < schema["minItems"]:
        errors.append(
            FieldError(
                shown,
                "FieldValueInvalid",
                f"Invalid value: {len(value)}: {shown} in body should have at "
                f"least {schema['minItems']} items",
            )
        )
    list_type = schema.get("x-kubernetes-list-type")
    if schema.get("uniqueItems") or list_type == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                errors.append(
                    FieldError(
                        f"{path}[{i}]", "FieldValueDuplicate", f"Duplicate value: {show(item)}"
                    )
                )
            seen.append(item)
    if list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen_keys: list[tuple[Any, ...]] = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            key = tuple(item.get(k) for k in keys)
            if key in seen_keys:
                shown_key = ", ".join(f"{k}: {show(item.get(k))}" for k in keys)
                errors.append(
                    FieldError(
                        f"{path}[{i}]",
                        "FieldValueDuplicate",
                        f"Duplicate value: map[string]interface {{}}{{{shown_key}}}",
                    )
                )
            seen_keys.append(key)
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            _validate(item, items, f"{path}[{i}]", errors)


def _objects(value: Obj, schema: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    for key in schema.get("required") or []:
        if key not in value:
            errors.append(FieldError(_join(path, key), "FieldValueRequired", "Required value"))
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, sub_value in value.items():
        if path == "" and key in ("apiVersion", "kind", "metadata"):
            continue
        if key in props:
            _validate(sub_value, props[key], _join(path, key), errors)
        elif isinstance(extra, Mapping):
            _validate(sub_value, extra, _join(path, key), errors)
    shown = path or "<root>"
    if schema.get("maxProperties") is not None and len(value) > schema["maxProperties"]:
        errors.append(
            FieldError(
                shown,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {schema['maxProperties']} items",
            )
        )
    if schema.get("minProperties") is not None and len(value) < schema["minProperties"]:
        errors.append(
            FieldError(
                shown,
                "FieldValueInvalid",
                f"Invalid value: {len(value)}: {shown} in body should have at "
                f"least {schema['minProperties']} properties",
            )
        )


def structural_problems(schema: Any, path: str = "openAPIV3Schema") -> list[FieldError]:
    """The few structural-schema rules a v1 CRD must follow that the fake checks."""
    problems: list[FieldError] = []
    if not isinstance(schema, Mapping):
        return [FieldError(path, "FieldValueRequired", "Required value: schemas are required")]
    if path == "openAPIV3Schema" and schema.get("type") != "object":
        problems.append(
            FieldError(
                f"{path}.type", "FieldValueRequired", "Required value: must be object at the root"
            )
        )
    for key, sub in (schema.get("properties") or {}).items():
        if (
            isinstance(sub, Mapping)
            and not sub.get("type")
            and not sub.get("x-kubernetes-int-or-string")
            and not sub.get("x-kubernetes-preserve-unknown-fields")
        ):
            problems.append(
                FieldError(
                    f"{path}.properties[{key}].type",
                    "FieldValueRequired",
                    "Required value: must not be empty for specified object fields",
                )
            )
        problems.extend(structural_problems(sub, f"{path}.properties[{key}]"))
    items = schema.get("items")
    if isinstance(items, Mapping):
        problems.extend(structural_problems(items, f"{path}.items"))
    return problems
