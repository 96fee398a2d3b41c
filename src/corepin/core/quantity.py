"""Kubernetes resource quantities (`"2"`, `"1500m"`, `"1Gi"`, `"1e3"`), read exactly.

The one parser of quantity text in corepin: the pod models read CPU limits and requests with it
(`corepin.kube.models`), the node agent its CFS quotas, and the allocator the CPU count of a
node reservation (`corepin.allocation.pools`). Pure: text in, `Fraction` out.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

from corepin.core.errors import InputError

_QUANTITY = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?\Z",
    re.ASCII,
)
_DECIMAL_SUFFIX: Final = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY_SUFFIX: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
#: The longest quantity text read.
MAX_LENGTH: Final = 64
#: The largest decimal exponent read (`1e40`).
MAX_EXPONENT: Final = 40


class QuantityError(InputError, ValueError):
    """A value that is not a Kubernetes quantity; `problem` says why (without the value)."""

    default_reason = "bad_quantity"

    def __init__(self, value: object, problem: str) -> None:
        self.value = value
        self.problem = problem
        shown = repr(value)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        super().__init__(f"invalid quantity {shown}: {problem}")


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes resource quantity, exactly: "2" -> 2, "2000m" -> 2, "2.0" -> 2,
    "1500m" -> 3/2, "1e3" -> 1000, "1Ki" -> 1024. JSON numbers are accepted too."""
    if isinstance(value, bool):
        raise QuantityError(value, "must be a quantity such as '2' or '1500m'")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(value, "must be a finite quantity")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise QuantityError(value, "must be a quantity such as '2' or '1500m'")
    known = _QUANTITIES.get(value)
    if known is not None:
        return known
    match = _QUANTITY.match(value)
    if match is None or len(value) > MAX_LENGTH:
        raise QuantityError(value, "is not a Kubernetes quantity such as '2' or '1500m'")
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    if number.isdigit():  # (Fraction's own text parsing is some 30x slower)
        amount = Fraction(int(number))
    else:
        amount = Fraction(number if not number.endswith(".") else number[:-1])
    if suffix in _BINARY_SUFFIX:
        amount *= 2 ** _BINARY_SUFFIX[suffix]
    else:
        exponent = _DECIMAL_SUFFIX[suffix] if suffix in _DECIMAL_SUFFIX else int(suffix[1:])
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(value, "is out of range")
        amount *= Fraction(10) ** exponent
    if sign == "-":
        amount = -amount
    if len(_QUANTITIES) < 4096:  # the few distinct texts a node sees, parsed once each
        _QUANTITIES[value] = amount
    return amount


_QUANTITIES: dict[str, Fraction] = {}
