"""Label and field selectors with the API server's grammar and matching rules.

Label selectors (apimachinery `labels.Parse`): comma-separated requirements, each one of
`key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a,b)`, `key>N`, `key<N`.
`!=` and `notin` also match objects without the label. Field selectors: `field=v`, `field==v`,
`field!=v`, comma-separated, with `\\,`, `\\=` and `\\\\` escapes in values; only the fields a
resource declares may be used (others are a 400 "field label not supported").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class SelectorError(ValueError):
    """A selector the API server would refuse with 400 BadRequest."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # exists, !, =, !=, in, notin, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present or value is None:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(r.matches(found) for r in self.requirements)


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _check_key(key: str) -> str:
    if not _KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r}")
    return key


def _check_value(value: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(f"unable to parse requirement: invalid label value: {value!r}")
    return value


_SET_OP = re.compile(r"^\s*(?P<key>[^\s!=<>()]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)\s*$")
_CMP_OP = re.compile(r"^\s*(?P<key>[^\s!=<>()]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<val>[^\s()]*)\s*$")


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse `labelSelector`; raises SelectorError with the server's wording on bad input."""
    if text is None or not text.strip():
        return LabelSelector()
    reqs: list[Requirement] = []
    for raw in _split_top(text):
        part = raw.strip()
        if not part:
            raise SelectorError(
                f"unable to parse requirement: found '', expected: identifier in {text!r}"
            )
        match = _SET_OP.match(part)
        if match:
            values = tuple(_check_value(v.strip()) for v in match["vals"].split(",") if v.strip())
            reqs.append(Requirement(_check_key(match["key"]), match["op"], values))
            continue
        if part.startswith("!"):
            reqs.append(Requirement(_check_key(part[1:].strip()), "!"))
            continue
        match = _CMP_OP.match(part)
        if match:
            op = {"==": "=", ">": "gt", "<": "lt"}.get(match["op"], match["op"])
            value = match["val"]
            if op in ("gt", "lt"):
                try:
                    int(value)
                except ValueError:
                    raise SelectorError(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be"
                        f" an integer: {value!r}"
                    ) from None
            else:
                _check_value(value)
            reqs.append(Requirement(_check_key(match["key"]), op, (value,)))
            continue
        reqs.append(Requirement(_check_key(part), "exists"))
    return LabelSelector(tuple(reqs))


def label_selector_from_object(selector: Mapping[str, Any]) -> LabelSelector:
    """A metav1.LabelSelector (matchLabels / matchExpressions) as a LabelSelector."""
    reqs = [Requirement(k, "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in selector.get("matchExpressions") or []:
        reqs.append(
            Requirement(expr["key"], ops[expr["operator"]], tuple(expr.get("values") or ()))
        )
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    negate: bool
    value: str


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        for req in self.requirements:
            equal = fields.get(req.field, "") == req.value
            if equal == req.negate:
                return False
        return True

    def names(self) -> set[str]:
        return {r.field for r in self.requirements}


def _split_escaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(value: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value):
            if value[i + 1] not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence in {value!r}")
            out.append(value[i + 1])
            i += 2
            continue
        if value[i] in ",=":
            raise SelectorError(f"invalid field selector: unescaped {value[i]!r} in {value!r}")
        out.append(value[i])
        i += 1
    return "".join(out)


def parse_field_selector(text: str | None, supported: Callable[[str], bool]) -> FieldSelector:
    """Parse `fieldSelector`; fields the resource does not support are refused like the server."""
    if text is None or not text.strip():
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for part in _split_escaped(text, ","):
        if not part:
            continue
        for op in ("!=", "==", "="):
            idx = _find_unescaped(part, op)
            if idx >= 0:
                field = part[:idx].strip()
                value = _unescape(part[idx + len(op) :])
                if not supported(field):
                    raise SelectorError(f"field label not supported: {field}")
                reqs.append(FieldRequirement(field, op == "!=", value))
                break
        else:
            raise SelectorError(f"invalid selector: '{part}'; can't understand '{part}'")
    return FieldSelector(tuple(reqs))


def _find_unescaped(text: str, op: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(op, i):
            return i
        i += 1
    return -1
