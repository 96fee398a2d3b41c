"""`meta.k8s.io/v1` Table answers (what `kubectl get` asks for with `Accept: ...;as=Table`)
and the small JSONPath subset CRD printer columns use."""

from __future__ import annotations

import json
import re
from typing import Any

from corepin.testing.fakeapi.resources import Column, ResourceType, age

Obj = dict[str, Any]

_NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "priority": 0,
    "description": "Name must be unique within a namespace.",
}
_FILTER = re.compile(r"^\?\(@\.([\w.]+)\s*==\s*(['\"])(.*)\2\)$")


def _tokens(path: str) -> list[str]:
    out: list[str] = []
    for part in re.findall(r"\[[^\]]*\]|[^.\[\]]+", path.strip().lstrip("{").rstrip("}")):
        out.append(part)
    return out


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Values at a simple JSONPath (`.a.b`, `.a[0]`, `.a[*].b`, `.a[?(@.k=="v")].b`)."""
    current: list[Any] = [obj]
    for token in _tokens(path):
        nxt: list[Any] = []
        if token.startswith("["):
            inner = token[1:-1]
            for value in current:
                if not isinstance(value, list):
                    continue
                if inner == "*":
                    nxt.extend(value)
                elif inner.lstrip("-").isdigit():
                    idx = int(inner)
                    if -len(value) <= idx < len(value):
                        nxt.append(value[idx])
                else:
                    match = _FILTER.match(inner)
                    if match:
                        keys = match.group(1).split(".")
                        for item in value:
                            found: Any = item
                            for key in keys:
                                found = found.get(key) if isinstance(found, dict) else None
                            if found is not None and str(found) == match.group(3):
                                nxt.append(item)
        else:
            for value in current:
                if isinstance(value, dict) and token in value:
                    nxt.append(value[token])
        current = nxt
    return current


def _cell(column: Column, obj: Obj) -> Any:
    if column.cell is not None:
        return column.cell(obj)
    values = jsonpath(obj, column.json_path)
    if not values:
        return None
    value = (
        values[0]
        if len(values) == 1
        else ",".join(v if isinstance(v, str) else json.dumps(v) for v in values)
    )
    if column.type == "date" and isinstance(value, str):
        return age(value)
    return value


def _definition(column: Column) -> Obj:
    return {
        "name": column.name,
        "type": column.type,
        "format": "",
        "description": column.description,
        "priority": column.priority,
    }


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata") or {},
    }


def table(
    rt: ResourceType,
    objects: list[Obj],
    metadata: Obj,
    include: str = "Metadata",
    *,
    with_columns: bool = True,
) -> Obj:
    rows = []
    for obj in objects:
        row: Obj = {
            "cells": [(obj.get("metadata") or {}).get("name", "")]
            + [_cell(c, obj) for c in rt.columns]
        }
        row_obj = _row_object(obj, include)
        if row_obj is not None:
            row["object"] = row_obj
        rows.append(row)
    out: Obj = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "rows": rows}
    if with_columns:
        out["columnDefinitions"] = [_NAME_COLUMN] + [_definition(c) for c in rt.columns]
    return out
