"""The three classic PATCH flavours: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the
strategic merge patch of built-in kinds (lists merged by their merge keys, `$patch`,
`$retainKeys`, `$setElementOrder/...`, `$deleteFromPrimitiveList/...` directives)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
ListKeys = Callable[[tuple[str, ...]], "tuple[str, ...] | None"]


class PatchError(ValueError):
    """A patch that cannot be applied; `code` is the HTTP status the server answers with."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'", 400)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if for_add and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    idx = int(token)
    limit = len(container) if for_add else len(container) - 1
    if idx > limit:
        raise PatchError(f"array index {idx} out of bounds")
    return idx


def _parent(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for token in tokens[:-1]:
        if isinstance(cur, dict):
            if token not in cur:
                raise PatchError(f"doc is missing path: /{'/'.join(tokens)}")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(cur, token, for_add=False)]
        else:
            raise PatchError(f"doc is missing path: /{'/'.join(tokens)}")
    return cur


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"doc is missing key: /{'/'.join(tokens)}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise PatchError(f"doc is missing path: /{'/'.join(tokens)}")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_add=True), value)
    else:
        raise PatchError(f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"Unable to remove nonexistent key: {last}: missing value")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, for_add=False)]
    else:
        raise PatchError(f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902; a failed `test` or a missing path is a PatchError (422)."""
    if not isinstance(operations, list):
        raise PatchError("json: cannot unmarshal object into Go value of type jsonpatch.Patch", 400)
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"invalid JSON patch operation {json.dumps(op)}", 400)
        kind = op["op"]
        tokens = _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, tokens)
        elif kind == "replace":
            _get(doc, tokens)
            if tokens:
                doc = _remove(doc, tokens)
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, tokens, value)
        elif kind == "test":
            if _get(doc, tokens) != op.get("value"):
                raise PatchError(f"testing value {op['path']} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}", 400)
    return doc


def _item_key(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...] | None:
    if not isinstance(item, dict):
        return None
    return tuple(item.get(k) for k in keys)


def strategic_merge_patch(
    target: Any, patch: Any, list_keys: ListKeys, path: tuple[str, ...] = ()
) -> Any:
    """Apply a strategic merge patch; `list_keys(path)` gives a list's merge keys."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive not in (None, "merge"):
        raise PatchError(f"Unknown patch type: {directive}", 400)
    result: Obj = copy.deepcopy(target) if isinstance(target, dict) else {}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key == "$patch":
            continue
        if key == "$retainKeys":
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
            continue
        sub_path = (*path, key)
        if isinstance(value, list):
            merged = _merge_list(result.get(key), value, list_keys, sub_path)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, dict):
            merged_map = strategic_merge_patch(result.get(key), value, list_keys, sub_path)
            if merged_map is None:
                result.pop(key, None)
            else:
                result[key] = merged_map
        else:
            result[key] = value
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            result[field] = _order(result[field], order, list_keys((*path, field)))
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(
    current: Any, patch: list[Any], list_keys: ListKeys, path: tuple[str, ...]
) -> list[Any] | None:
    keys = list_keys(path)
    if keys is None or not isinstance(current, list):
        if keys is not None and keys != ("set",):
            return [
                strategic_merge_patch(None, p, list_keys, (*path, "*"))
                if isinstance(p, dict)
                else p
                for p in patch
                if not (isinstance(p, dict) and p.get("$patch") == "delete")
            ]
        return copy.deepcopy(patch)
    if keys == ("set",):
        out = list(current)
        for item in patch:
            if item not in out:
                out.append(copy.deepcopy(item))
        return out
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [
            copy.deepcopy(p)
            for p in patch
            if not (isinstance(p, dict) and p.get("$patch") == "replace")
        ]
    out = copy.deepcopy(current)
    for item in patch:
        key = _item_key(item, keys)
        where = next((i for i, cur in enumerate(out) if _item_key(cur, keys) == key), None)
        if isinstance(item, dict) and item.get("$patch") == "delete":
            if where is not None:
                del out[where]
            continue
        if where is None:
            out.append(strategic_merge_patch(None, item, list_keys, (*path, "*")))
        else:
            out[where] = strategic_merge_patch(out[where], item, list_keys, (*path, "*"))
    return out


def _order(items: list[Any], order: list[Any], keys: tuple[str, ...] | None) -> list[Any]:
    def key_of(item: Any) -> Any:
        if keys and keys != ("set",):
            return json.dumps(_item_key(item, keys))
        return json.dumps(item, sort_keys=True)

    rank = {key_of(o): i for i, o in enumerate(order)}
    ranked = sorted((i for i in items if key_of(i) in rank), key=lambda i: rank[key_of(i)])
    rest = [i for i in items if key_of(i) not in rank]
    return ranked + rest
