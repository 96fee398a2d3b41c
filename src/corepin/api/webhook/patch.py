"""JSONPatch (RFC 6902) operations for a pod, built so that they apply to the pod as it was
sent (pure).

JSON pointers are escaped as RFC 6901 says (`pointer("metadata", "annotations",
"corepin.io/x")` is `/metadata/annotations/corepin.io~1x`); arrays and objects the pod lacks
are added whole, with everything that goes into them.
"""

from __future__ import annotations

from collections.abc import Mapping


def pointer(*tokens: str | int) -> str:
    """An RFC 6901 JSON pointer: `pointer("metadata", "annotations", "corepin.io/x")` ->
    `/metadata/annotations/corepin.io~1x`."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


Path = tuple[str | int, ...]


class JsonPatch:
    """JSONPatch operations, built so that they apply to the pod as it was sent: a missing
    array or object is added whole (with everything that goes into it), later items appended
    (`/-`) to it; an existing member is replaced in place."""

    def __init__(self) -> None:
        self.ops: list[dict[str, object]] = []
        self._lists: dict[str, list[object]] = {}  # arrays this patch adds whole, by pointer
        self._objects: dict[str, dict[str, object]] = {}  # objects it adds whole

    def add(self, path: Path, value: object) -> None:
        self.ops.append({"op": "add", "path": pointer(*path), "value": value})

    def append(self, path: Path, existing: object, item: object) -> None:
        """Append `item` to the array at `path` (`existing` is what the pod has there)."""
        where = pointer(*path)
        if isinstance(existing, list):
            self.ops.append({"op": "add", "path": where + "/-", "value": item})
        elif where in self._lists:
            self._lists[where].append(item)
        else:
            value = [item]
            self._lists[where] = value
            self.ops.append({"op": "add", "path": where, "value": value})

    def put_object(self, path: Path, existing: object, items: Mapping[str, object]) -> None:
        """Add the members `items` to the object at `path` (`existing`: the pod's)."""
        where = pointer(*path)
        if isinstance(existing, Mapping):
            for key, value in items.items():
                self.ops.append({"op": "add", "path": pointer(*path, key), "value": value})
        elif where in self._objects:
            self._objects[where].update(items)
        else:
            members = dict(items)
            self._objects[where] = members
            self.ops.append({"op": "add", "path": where, "value": members})

    def replace(self, path: Path, value: object) -> None:
        self.ops.append({"op": "replace", "path": pointer(*path), "value": value})
