"""Server-side apply and `metadata.managedFields`, the basics clients rely on.

Field sets are sets of paths in the fieldsV1 spelling (`f:spec`, `k:{"name":"app"}` for an item
of a list with merge keys, `v:"x"` for a member of a set). Apply: the applied configuration is
the whole intent of its field manager; a field another manager owns with a different value is a
409 conflict unless `force=true` (which takes the field over); fields the manager applied before
and dropped now are removed unless someone else owns them. Non-apply writes (create, update,
patch) give their manager the fields they changed and take those fields from other managers.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Path = tuple[str, ...]
ListKeys = Callable[[tuple[str, ...]], "tuple[str, ...] | None"]

_TRACKED_META = ("labels", "annotations", "finalizers", "ownerReferences")


@dataclass
class ManagerEntry:
    manager: str
    operation: str  # Apply | Update
    api_version: str
    subresource: str = ""
    time: str = ""
    paths: set[Path] = field(default_factory=set)

    def key(self) -> tuple[str, str, str]:
        return (self.manager, self.operation, self.subresource)

    def to_json(self) -> Obj:
        out: Obj = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(self.paths),
        }
        if self.subresource:
            out["subresource"] = self.subresource
        return out


@dataclass(frozen=True)
class ApplyConflict:
    manager: str
    path: str


class ApplyConflicts(Exception):
    def __init__(self, conflicts: list[ApplyConflict], api_version: str) -> None:
        self.conflicts = conflicts
        self.api_version = api_version
        count = len(conflicts)
        lines = "; ".join(
            f'conflict with "{c.manager}" using {api_version}: {c.path}' for c in conflicts
        )
        super().__init__(f"Apply failed with {count} conflict{'s' if count > 1 else ''}: {lines}")


def now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _item_element(item: Any, keys: tuple[str, ...]) -> str:
    if keys == ("set",) or not isinstance(item, dict):
        return "v:" + json.dumps(item, separators=(",", ":"), sort_keys=True)
    ident = {k: item[k] for k in keys if k in item}
    return "k:" + json.dumps(ident, separators=(",", ":"))


def field_paths(obj: Any, list_keys: ListKeys) -> set[Path]:
    """Every field path of a whole object (the root's apiVersion/kind and the server-owned
    metadata fields are not tracked)."""
    out: set[Path] = set()
    if not isinstance(obj, dict):
        return out
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "metadata":
            if isinstance(value, dict):
                for mkey in _TRACKED_META:
                    if mkey in value and value[mkey] is not None:
                        _walk(
                            value[mkey],
                            ("f:metadata", f"f:{mkey}"),
                            ("metadata", mkey),
                            list_keys,
                            out,
                        )
            continue
        _walk(value, (f"f:{key}",), (key,), list_keys, out)
    return out


def _walk(
    value: Any, path: Path, data_path: tuple[str, ...], list_keys: ListKeys, out: set[Path]
) -> None:
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            _walk(sub, (*path, f"f:{key}"), (*data_path, key), list_keys, out)
        return
    if isinstance(value, list) and value:
        keys = list_keys(data_path)
        if keys is not None:
            for item in value:
                element = _item_element(item, keys)
                out.add((*path, element))
                if element.startswith("k:") and isinstance(item, dict):
                    for key, sub in item.items():
                        _walk(
                            sub,
                            (*path, element, f"f:{key}"),
                            (*data_path, "*", key),
                            list_keys,
                            out,
                        )
            return
    out.add(path)


def to_fields_v1(paths: set[Path]) -> Obj:
    root: Obj = {}
    for path in sorted(paths):
        node = root
        for element in path:
            node = node.setdefault(element, {})
    # a path that is itself a member and also has members below it is marked with "."
    for path in paths:
        node = root
        for element in path:
            node = node[element]
        if node and "." not in node:
            node["."] = {}
    return root


def from_fields_v1(tree: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(tree, dict):
        return out
    if not tree and prefix:
        out.add(prefix)
    for element, sub in tree.items():
        if element == ".":
            out.add(prefix)
            continue
        out |= from_fields_v1(sub, (*prefix, element))
    return out


def _step(node: Any, element: str) -> tuple[bool, Any, Any]:
    """(found, value, container-or-index) for one path element."""
    if element.startswith("f:"):
        name = element[2:]
        if isinstance(node, dict) and name in node:
            return True, node[name], name
        return False, None, None
    if isinstance(node, list):
        ident = json.loads(element[2:])
        for i, item in enumerate(node):
            if element.startswith("k:"):
                if isinstance(item, dict) and all(item.get(k) == v for k, v in ident.items()):
                    return True, item, i
            elif item == ident:
                return True, item, i
    return False, None, None


def get_at(obj: Any, path: Path) -> tuple[bool, Any]:
    node = obj
    for element in path:
        found, node, _ = _step(node, element)
        if not found:
            return False, None
    return True, node


def remove_at(obj: Any, path: Path) -> None:
    node = obj
    for element in path[:-1]:
        found, node, _ = _step(node, element)
        if not found:
            return
    found, _, where = _step(node, path[-1])
    if found:
        del node[where]


def merge_applied(
    current: Any, applied: Any, list_keys: ListKeys, data_path: tuple[str, ...] = ()
) -> Any:
    """The applied configuration laid over the live object (maps and keyed lists merge)."""
    if isinstance(applied, dict) and isinstance(current, dict):
        out = copy.deepcopy(current)
        for key, value in applied.items():
            out[key] = merge_applied(current.get(key), value, list_keys, (*data_path, key))
        return out
    if isinstance(applied, list) and isinstance(current, list):
        keys = list_keys(data_path)
        if keys == ("set",):
            merged = list(current)
            merged.extend(copy.deepcopy(v) for v in applied if v not in merged)
            return merged
        if keys:
            out_list = copy.deepcopy(current)
            for item in applied:
                element = _item_element(item, keys)
                found, _, where = _step(out_list, element)
                if found:
                    out_list[where] = merge_applied(
                        out_list[where], item, list_keys, (*data_path, "*")
                    )
                else:
                    out_list.append(copy.deepcopy(item))
            return out_list
    return copy.deepcopy(applied)


def _is_membership(path: Path) -> bool:
    return path[-1].startswith(("k:", "v:"))


def _covered(path: Path, owned: set[Path]) -> bool:
    """Someone owns `path` itself or something below it."""
    return any(p[: len(path)] == path for p in owned)


def server_side_apply(
    current: Obj | None,
    applied: Obj,
    entries: list[ManagerEntry],
    manager: str,
    api_version: str,
    subresource: str,
    force: bool,
    list_keys: ListKeys,
) -> tuple[Obj, list[ManagerEntry]]:
    """The object after applying `applied` for `manager`, and the new managed field entries."""
    base: Obj = copy.deepcopy(current) if current is not None else {}
    applied_paths = field_paths(applied, list_keys)
    me = (manager, "Apply", subresource)
    conflicts: list[ApplyConflict] = []
    taken: dict[tuple[str, str, str], set[Path]] = {}
    for entry in entries:
        if entry.key() == me:
            continue
        for path in entry.paths & applied_paths:
            if _is_membership(path):
                continue
            _, live = get_at(base, path)
            _, wanted = get_at(applied, path)
            if live != wanted:
                conflicts.append(ApplyConflict(entry.manager, _dotted(path)))
                taken.setdefault(entry.key(), set()).add(path)
    if conflicts and not force:
        raise ApplyConflicts(conflicts, api_version)
    new_entries = [copy.deepcopy(e) for e in entries if e.key() != me]
    for entry in new_entries:
        entry.paths -= taken.get(entry.key(), set())
    previous = next((e.paths for e in entries if e.key() == me), set())
    merged = merge_applied(base, applied, list_keys)
    others: set[Path] = set().union(*(e.paths for e in new_entries)) if new_entries else set()
    for path in sorted(previous - applied_paths, key=len, reverse=True):
        if not _covered(path, others) and not _covered(path, applied_paths):
            remove_at(merged, path)
    new_entries = [e for e in new_entries if e.paths]
    new_entries.append(
        ManagerEntry(manager, "Apply", api_version, subresource, now_text(), applied_paths)
    )
    return merged, new_entries


def track_update(
    old: Obj | None,
    new: Obj,
    entries: list[ManagerEntry],
    manager: str,
    api_version: str,
    subresource: str,
    list_keys: ListKeys,
) -> list[ManagerEntry]:
    """Managed field entries after a non-apply write by `manager` turned `old` into `new`."""
    old_paths = field_paths(old, list_keys) if old is not None else set()
    new_paths = field_paths(new, list_keys)
    changed = {p for p in new_paths if p not in old_paths or get_at(old, p)[1] != get_at(new, p)[1]}
    me = (manager, "Update", subresource)
    out: list[ManagerEntry] = []
    mine: ManagerEntry | None = None
    for entry in entries:
        copied = copy.deepcopy(entry)
        copied.paths &= new_paths
        if copied.key() == me:
            mine = copied
        else:
            copied.paths -= changed
        if copied.paths or copied.key() == me:
            out.append(copied)
    if changed:
        if mine is None:
            mine = ManagerEntry(manager, "Update", api_version, subresource)
            out.append(mine)
        mine.paths |= changed
        mine.time = now_text()
        mine.api_version = api_version
    return [e for e in out if e.paths]


def entries_from(obj: Obj | None) -> list[ManagerEntry]:
    out: list[ManagerEntry] = []
    for raw in ((obj or {}).get("metadata") or {}).get("managedFields") or []:
        out.append(
            ManagerEntry(
                raw.get("manager", ""),
                raw.get("operation", "Update"),
                raw.get("apiVersion", ""),
                raw.get("subresource", ""),
                raw.get("time", ""),
                from_fields_v1(raw.get("fieldsV1") or {}),
            )
        )
    return out


def _dotted(path: Path) -> str:
    parts: list[str] = []
    for element in path:
        if element.startswith("f:"):
            parts.append("." + element[2:])
        elif element.startswith("k:"):
            ident = json.loads(element[2:])
            parts.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in ident.items()) + "]")
        else:
            parts.append("[" + element[2:] + "]")
    return "".join(parts)
