"""CPUs held for a workload that has not come yet: one reservation as the state records it.

A reservation holds its CPUs (and the rest of the units its level withholds) like an exclusive
assignment: they are out of the free set and out of the shared pool, and no other workload gets
them. The workload it is for - a `corepin run --reservation NAME` on a host, a pod its owners
select on a node - gets exactly those CPUs: its assignment names the reservation
(`Assignment.reservation`) and is recorded in `consumed_by`.

- `reusable` False (Kubernetes' `allocateOnce`, the default): the first workload consumes it;
  when that workload is released the reservation goes with it.
- `reusable` True: it stays; its CPUs come back to it when its workload is released.
- `expires`: wall-clock seconds after which it ends (None: never). An expired reservation whose
  CPUs a workload still runs on ends too; the workload keeps its CPUs as its own.

`uid` is the identity of the object it came from (a CPUReservation's `metadata.uid`; empty for
host mode), so a reservation deleted and made again under the same name is a new one.
"""

from __future__ import annotations

from typing import Any, Final

from corepin.allocation.types import LEVELS
from corepin.core.cpuset import CPUSet
from corepin.core.errors import RequestError
from corepin.core.record import record

_EMPTY: Final = CPUSet()

#: Longest reservation name (a Kubernetes object name is at most 253 characters).
MAX_NAME: Final = 253


def check_name(name: object, where: str = "reservation name") -> str:
    """`name` when it is a usable reservation name (a DNS-1123 subdomain, as Kubernetes object
    names are); RequestError naming the value otherwise."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise RequestError(f"{where} must be 1 to {MAX_NAME} characters, got {name!r}")
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-.")
    if not set(name) <= allowed or not name[0].isalnum() or not name[-1].isalnum():
        raise RequestError(
            f"{where} {name!r} must be lower-case letters, digits, '-' and '.', starting and "
            "ending with a letter or digit"
        )
    return name


@record
class Reservation:
    """CPUs held for one workload yet to come (see the module docstring)."""

    name: str
    cpus: CPUSet
    withheld: CPUSet = _EMPTY
    level: str = "cpu"
    reusable: bool = False
    expires: float | None = None
    created: float = 0.0
    consumed_by: tuple[str, ...] = ()
    uid: str = ""

    def __post_init__(self) -> None:
        check_name(self.name)
        for key in ("cpus", "withheld"):
            if not isinstance(getattr(self, key), CPUSet):
                raise RequestError(f"reservation {self.name!r}: {key} must be a CPUSet")
        if not self.cpus:
            raise RequestError(f"reservation {self.name!r} holds no CPUs")
        if not self.withheld:
            object.__setattr__(self, "withheld", self.cpus)
        elif not self.cpus.issubset(self.withheld):
            raise RequestError(
                f"reservation {self.name!r}: withheld {self.withheld} must contain cpus {self.cpus}"
            )
        if self.level not in LEVELS:
            raise RequestError(
                f"reservation {self.name!r}: level must be one of {', '.join(LEVELS)}, "
                f"got {self.level!r}"
            )
        if self.expires is not None and (
            isinstance(self.expires, bool) or not isinstance(self.expires, (int, float))
        ):
            raise RequestError(f"reservation {self.name!r}: expires must be seconds or None")
        if isinstance(self.consumed_by, list):
            object.__setattr__(self, "consumed_by", tuple(self.consumed_by))
        if not all(isinstance(i, str) and i for i in self.consumed_by):
            raise RequestError(f"reservation {self.name!r}: consumed_by must be assignment ids")

    def expired(self, now: float) -> bool:
        """Whether its TTL has run out at wall-clock `now`."""
        return self.expires is not None and now >= self.expires

    @property
    def in_use(self) -> bool:
        """Whether a workload runs on its CPUs now."""
        return bool(self.consumed_by)

    @property
    def available(self) -> bool:
        """Whether a workload may take it now (not in use; a used-up one-time reservation is
        gone from the state, so it is never seen here)."""
        return not self.consumed_by

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cpus": str(self.cpus),
            "withheld": str(self.withheld),
            "level": self.level,
            "reusable": self.reusable,
            "expires": self.expires,
            "created": self.created,
            "consumed_by": list(self.consumed_by),
            "uid": self.uid,
        }


__all__ = ["MAX_NAME", "Reservation", "check_name"]
