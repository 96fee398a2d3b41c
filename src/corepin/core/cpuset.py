"""CPUSet: the one value type for sets of logical CPU ids.

A CPUSet is an immutable bitmask held in a Python int (bit i set = CPU i present). Set algebra
is a single integer operation, hashing and equality are integer ones, and nothing is allocated
per CPU. The canonical text form is the Linux list format (`0-3,8,10-11`, empty set = `""`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Final

from corepin.core.errors import CPUSetParseError

#: CPU ids must be below this bound: the largest NR_CPUS a Linux kernel can be built with.
MAX_CPUS: Final = 8192

_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?\Z")
_HEX_WORD = re.compile(r"[0-9a-fA-F]+\Z")


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _check_id(text: str, value: int) -> int:
    if value >= MAX_CPUS:
        raise CPUSetParseError(text, f"CPU id {value} is beyond the limit of {MAX_CPUS - 1}")
    return value


class CPUSet:
    """Immutable, hashable set of logical CPU ids backed by a bitmask."""

    __slots__ = ("_mask",)
    _mask: int

    def __init__(self, ids: Iterable[int] = ()) -> None:
        mask = 0
        for cpu in ids:
            if isinstance(cpu, bool) or not isinstance(cpu, int):
                raise TypeError(f"CPU ids are ints, got {cpu!r}")
            if cpu < 0 or cpu >= MAX_CPUS:
                raise ValueError(f"CPU id {cpu} is outside 0..{MAX_CPUS - 1}")
            mask |= 1 << cpu
        object.__setattr__(self, "_mask", mask)

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_bits(cls, mask: int) -> CPUSet:
        """The set whose members are the set bits of `mask` (no copy, no validation of width)."""
        if mask < 0:
            raise ValueError(f"a CPU mask cannot be negative: {mask}")
        if mask >> MAX_CPUS:
            raise ValueError(f"CPU mask has bits at or beyond {MAX_CPUS}")
        obj = object.__new__(cls)
        object.__setattr__(obj, "_mask", mask)
        return obj

    @classmethod
    def of(cls, *ids: int) -> CPUSet:
        return cls(ids)

    @classmethod
    def range(cls, first: int, last: int) -> CPUSet:
        """CPUs first..last inclusive."""
        if first < 0 or last < first or last >= MAX_CPUS:
            raise ValueError(f"bad CPU range {first}-{last}")
        return cls.from_bits(((1 << (last - first + 1)) - 1) << first)

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """Parse the Linux list format: `0-3,8`, `0-15:2/4` (stride form), `""` for none.

        Surrounding whitespace (such as the newline of a sysfs file) is ignored; anything else
        that is not exactly this grammar raises CPUSetParseError (a ValueError) naming the text.
        """
        if not isinstance(text, str):
            raise TypeError(f"CPUSet.parse takes a str, got {type(text).__name__}")
        body = text.strip()
        if not body:
            return _EMPTY
        mask = 0
        for item in body.split(","):
            if not item:
                raise CPUSetParseError(text, "empty element (stray comma)")
            match = _RANGE.match(item)
            if match is None or not item.isascii():
                raise CPUSetParseError(text, f"{item!r} is not a CPU id or range")
            if any(g is not None and len(g.lstrip("0")) > 6 for g in match.groups()):
                raise CPUSetParseError(text, f"{item!r} has a number beyond the limit")
            first = _check_id(text, int(match.group(1)))
            if match.group(2) is None:
                mask |= 1 << first
                continue
            last = _check_id(text, int(match.group(2)))
            if last < first:
                raise CPUSetParseError(text, f"range {item!r} ends before it starts")
            span = ((1 << (last - first + 1)) - 1) << first
            if match.group(3) is not None:
                used, group = int(match.group(3)), int(match.group(4))
                if group == 0 or used == 0 or used > group:
                    raise CPUSetParseError(
                        text, f"stride {used}/{group} in {item!r} needs 1 <= used <= group"
                    )
                pattern = 0
                unit = (1 << used) - 1
                for start in range(first, last + 1, group):
                    pattern |= unit << start
                span &= pattern
            mask |= span
        return cls.from_bits(mask)

    @classmethod
    def from_mask(cls, text: str) -> CPUSet:
        """Parse a hex mask as in /proc/PID/status `Cpus_allowed` (`ff,ffffffff`; `0x` allowed)."""
        if not isinstance(text, str):
            raise TypeError(f"CPUSet.from_mask takes a str, got {type(text).__name__}")
        body = text.strip()
        if body[:2].lower() == "0x":
            body = body[2:]
        if not body:
            raise CPUSetParseError(text, "empty mask")
        words = body.split(",")
        if len(body) > MAX_CPUS // 4 + len(words):
            raise CPUSetParseError(text, f"mask is wider than {MAX_CPUS} CPUs")
        for word in words:
            if not _HEX_WORD.match(word):
                raise CPUSetParseError(text, f"{word!r} is not a hexadecimal word")
            if len(words) > 1 and len(word) > 8:
                raise CPUSetParseError(text, f"word {word!r} is wider than 32 bits")
        mask = 0
        for word in words:
            mask = (mask << (32 if len(words) > 1 else 4 * len(word))) | int(word, 16)
        if mask >> MAX_CPUS:
            raise CPUSetParseError(text, f"mask sets CPUs at or beyond {MAX_CPUS}")
        return cls.from_bits(mask)

    # ----------------------------------------------------------------- output
    def to_mask(self, words: int = 0) -> str:
        """Hex mask in the kernel's format: 32-bit words, most significant first, comma separated.

        `words` pads to at least that many words (as /proc prints nr_cpu_ids bits).
        """
        count = max(1, words, (self._mask.bit_length() + 31) // 32)
        return ",".join(
            f"{(self._mask >> (32 * i)) & 0xFFFFFFFF:08x}" for i in range(count - 1, -1, -1)
        )

    def __str__(self) -> str:
        parts: list[str] = []
        mask = self._mask
        while mask:
            low = (mask & -mask).bit_length() - 1
            run = ~(mask >> low) & ((mask >> low) + 1)  # lowest zero bit above the run
            high = low + run.bit_length() - 2
            parts.append(str(low) if high == low else f"{low}-{high}")
            mask &= ~(((1 << (high - low + 1)) - 1) << low)
        return ",".join(parts)

    def __repr__(self) -> str:
        return f"CPUSet({str(self)!r})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    # ----------------------------------------------------------------- queries
    @property
    def bits(self) -> int:
        """The underlying bitmask."""
        return self._mask

    def __len__(self) -> int:
        return self._mask.bit_count()

    def __bool__(self) -> bool:
        return self._mask != 0

    def __iter__(self) -> Iterator[int]:
        return _bits(self._mask)

    def __reversed__(self) -> Iterator[int]:
        return iter(sorted(_bits(self._mask), reverse=True))

    def __contains__(self, cpu: object) -> bool:
        return isinstance(cpu, int) and 0 <= cpu < MAX_CPUS and (self._mask >> cpu) & 1 == 1

    def sorted(self) -> list[int]:
        return list(_bits(self._mask))

    def first(self) -> int:
        """Lowest CPU id; ValueError on the empty set."""
        if not self._mask:
            raise ValueError("empty CPU set has no first CPU")
        return (self._mask & -self._mask).bit_length() - 1

    def last(self) -> int:
        """Highest CPU id; ValueError on the empty set."""
        if not self._mask:
            raise ValueError("empty CPU set has no last CPU")
        return self._mask.bit_length() - 1

    def lowest(self, n: int) -> CPUSet:
        """The n lowest-numbered CPUs (all of them when n >= len)."""
        mask, out = self._mask, 0
        while mask and n > 0:
            low = mask & -mask
            out |= low
            mask ^= low
            n -= 1
        return CPUSet.from_bits(out)

    def isdisjoint(self, other: CPUSet) -> bool:
        return self._mask & other._mask == 0

    def issubset(self, other: CPUSet) -> bool:
        return self._mask & ~other._mask == 0

    def issuperset(self, other: CPUSet) -> bool:
        return other._mask & ~self._mask == 0

    # ----------------------------------------------------------------- algebra
    def union(self, *others: CPUSet) -> CPUSet:
        mask = self._mask
        for other in others:
            mask |= other._mask
        return CPUSet.from_bits(mask)

    def intersection(self, *others: CPUSet) -> CPUSet:
        mask = self._mask
        for other in others:
            mask &= other._mask
        return CPUSet.from_bits(mask)

    def difference(self, *others: CPUSet) -> CPUSet:
        mask = self._mask
        for other in others:
            mask &= ~other._mask
        return CPUSet.from_bits(mask)

    def symmetric_difference(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_bits(self._mask ^ other._mask)

    def __or__(self, other: CPUSet) -> CPUSet:
        if not isinstance(other, CPUSet):
            return NotImplemented
        return CPUSet.from_bits(self._mask | other._mask)

    def __and__(self, other: CPUSet) -> CPUSet:
        if not isinstance(other, CPUSet):
            return NotImplemented
        return CPUSet.from_bits(self._mask & other._mask)

    def __sub__(self, other: CPUSet) -> CPUSet:
        if not isinstance(other, CPUSet):
            return NotImplemented
        return CPUSet.from_bits(self._mask & ~other._mask)

    def __xor__(self, other: CPUSet) -> CPUSet:
        if not isinstance(other, CPUSet):
            return NotImplemented
        return CPUSet.from_bits(self._mask ^ other._mask)

    def __le__(self, other: CPUSet) -> bool:
        if not isinstance(other, CPUSet):
            return NotImplemented
        return self.issubset(other)

    def __lt__(self, other: CPUSet) -> bool:
        if not isinstance(other, CPUSet):
            return NotImplemented
        return self._mask != other._mask and self.issubset(other)

    def __ge__(self, other: CPUSet) -> bool:
        if not isinstance(other, CPUSet):
            return NotImplemented
        return self.issuperset(other)

    def __gt__(self, other: CPUSet) -> bool:
        if not isinstance(other, CPUSet):
            return NotImplemented
        return self._mask != other._mask and self.issuperset(other)

    # ----------------------------------------------------------------- identity
    def __eq__(self, other: object) -> bool:
        return isinstance(other, CPUSet) and self._mask == other._mask

    def __hash__(self) -> int:
        return hash(("CPUSet", self._mask))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CPUSet is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("CPUSet is immutable")

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (CPUSet.from_bits, (self._mask,))

    def __copy__(self) -> CPUSet:
        return self

    def __deepcopy__(self, memo: object) -> CPUSet:
        return self


_EMPTY: Final = CPUSet.from_bits(0)
EMPTY: Final = _EMPTY
