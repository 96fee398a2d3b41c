"""Request and decision types shared by every allocation policy (ALLOCATION_API.md).

A `Request` is what a workload asks for; a `Decision` is what a policy answers: the CPUs, the
memory nodes that go with them, the CPUs withheld from everyone else by the exclusiveness level,
and an explanation made of `Step`s (the levels tried and why each was chosen or skipped).

Requests validate themselves on construction and raise `RequestError` (exit 2) naming the bad
value; policies validate their own options. Everything here is immutable.

`Request.near` is the set of CPUs a workload should run near (the CPUs local to the devices it
uses, `corepin.allocation.near`): every policy takes its CPUs there when enough are free and
falls back outside only when `near_strict` is off.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from corepin.core.cpuset import CPUSet
from corepin.core.errors import RequestError
from corepin.core.record import field, record

if TYPE_CHECKING:
    from corepin.topology.model import Topology

#: Exclusiveness levels, narrowest first: the unit whose whole CPUs a decision withholds.
LEVELS: Final = ("cpu", "core", "l3", "numa", "socket")
#: Workload families of the workload-aware policy (actimanager's families).
WORKLOADS: Final = ("memory-bound", "cpu-bound", "io-bound", "best-effort")
#: SMT preferences: policy default, whole physical cores, or one thread per core.
SMT_MODES: Final = ("auto", "whole-cores", "spread")
#: Options that every policy understands: they become Request fields (allocation/api.py).
REQUEST_OPTIONS: Final = (
    "level",
    "workload",
    "smt",
    "numa",
    "prefer-isolated",
    "shared",
    "near",
    "near-strict",
)

_NO_OPTIONS: Final[Mapping[str, str]] = MappingProxyType({})


@record
class Request:
    """What a workload asks for. Raises RequestError (naming the value) when it makes no sense."""

    count: int
    exclusive: bool = True
    level: str = "cpu"
    numa_hint: CPUSet | None = None
    workload: str | None = None
    smt: str = "auto"
    prefer_isolated: bool = True
    options: Mapping[str, str] = field(default_factory=lambda: _NO_OPTIONS)
    #: CPUs to run near (a device's local CPUs): preferred, or required with `near_strict`
    near: CPUSet | None = None
    near_strict: bool = False

    def __post_init__(self) -> None:
        count = self.count
        if isinstance(count, bool) or not isinstance(count, int):
            raise RequestError(
                f"CPU count must be a positive integer, got {count!r}", reason="bad_count"
            )
        if count <= 0:
            raise RequestError(
                f"CPU count must be a positive integer, got {count}", reason="bad_count"
            )
        if self.level not in LEVELS:
            raise RequestError(
                f"unknown exclusiveness level {self.level!r} (choose from {', '.join(LEVELS)})",
                reason="bad_level",
            )
        if self.workload is not None and self.workload not in WORKLOADS:
            raise RequestError(
                f"unknown workload family {self.workload!r} (choose from {', '.join(WORKLOADS)})",
                reason="bad_workload",
            )
        if self.smt not in SMT_MODES:
            raise RequestError(
                f"unknown SMT preference {self.smt!r} (choose from {', '.join(SMT_MODES)})",
                reason="bad_smt",
            )
        if self.numa_hint is not None and not isinstance(self.numa_hint, CPUSet):
            raise RequestError(
                f"numa_hint must be a CPUSet of NUMA node ids, got {self.numa_hint!r}",
                reason="bad_numa_hint",
            )
        self._check_near()
        if not isinstance(self.options, Mapping):
            raise RequestError(
                f"options must be a mapping of name to value, got {self.options!r}",
                reason="bad_option",
            )
        if not isinstance(self.options, MappingProxyType):
            object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def _check_near(self) -> None:
        if self.near is not None and not isinstance(self.near, CPUSet):
            raise RequestError(f"near must be a CPUSet, got {self.near!r}", reason="bad_near")
        if not isinstance(self.near_strict, bool):
            raise RequestError(
                f"near_strict must be true or false, got {self.near_strict!r}", reason="bad_near"
            )
        if self.near_strict and self.near is None:
            raise RequestError(
                "near-strict needs the CPUs to be near (option near=CPUS)", reason="bad_near"
            )
        if self.near is not None and (not self.exclusive or self.workload == "best-effort"):
            raise RequestError(
                f"near={self.near} shapes exclusive requests only (a shared or best-effort "
                "request runs in the shared pool)",
                reason="bad_near",
            )

    def __hash__(self) -> int:
        return hash(
            (
                self.count,
                self.exclusive,
                self.level,
                self.numa_hint,
                self.workload,
                self.smt,
                self.prefer_isolated,
                tuple(sorted(self.options.items())),
                self.near,
                self.near_strict,
            )
        )


@record
class Step:
    """One line of a decision's explanation: at `level`, `choice` was taken (or skipped) because
    `reason`."""

    level: str
    choice: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "choice": self.choice, "reason": self.reason}


@record
class Decision:
    """A policy's answer. `cpus` has exactly request.count CPUs for exclusive requests (the shared
    pool for shared ones); `mems` are the NUMA node ids of `cpus`; `withheld` is `cpus` plus the
    rest of the units the exclusiveness level withholds from everyone else (empty for shared
    decisions). "Withheld" is never "reserved": reserved CPUs are the node's system CPUs."""

    cpus: CPUSet
    mems: CPUSet
    withheld: CPUSet
    policy: str
    explanation: tuple[Step, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON of `corepin allocate -o json`. The allocate contract names the withheld set
        `reserved`; that key is kept for it, `withheld` carries the same set by its own name."""
        return {
            "cpus": str(self.cpus),
            "mems": str(self.mems),
            "withheld": str(self.withheld),
            "reserved": str(self.withheld),
            "policy": self.policy,
            "explanation": [s.to_json() for s in self.explanation],
        }


class Policy(Protocol):
    """An allocation policy: pure, deterministic, never mutates its inputs.

    `decide` raises AllocationError (exit 3, `.reason` such as "not_enough_cpus" or
    "smt_alignment") when the request cannot be met from `available`, RequestError for a request
    or option the policy does not accept.
    """

    name: str

    def decide(self, topology: Topology, request: Request, available: CPUSet) -> Decision: ...


@runtime_checkable
class BestEffortPlacer(Protocol):
    """A policy that can place a best-effort workload inside the shared pool: on the CPUs of
    `pool` the fewest others share, given `usage` (CPU -> number of shared workloads pinned
    there). Policies without it run best-effort workloads on the whole shared pool."""

    def place_best_effort(
        self,
        topology: Topology,
        request: Request,
        pool: CPUSet,
        usage: Mapping[int, int] | None,
    ) -> Decision: ...


_TRUE: Final = frozenset({"", "true", "yes", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "off", "0"})


def option_flag(options: Mapping[str, str], name: str) -> bool:
    """The boolean option `name` ("name" alone or "name=true|false|yes|no|on|off|1|0")."""
    value = options.get(name)
    if value is None:
        return False
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise RequestError(
        f"option {name!r} takes true or false, got {value!r}", reason="bad_option_value"
    )


def check_options(options: Mapping[str, str], accepted: tuple[str, ...], policy: str) -> None:
    """RequestError naming the first option `policy` does not know."""
    for name in sorted(options):
        if name not in accepted:
            known = ", ".join(accepted) if accepted else "none"
            raise RequestError(
                f"unknown option {name!r} for policy {policy!r} (request options: "
                f"{', '.join(REQUEST_OPTIONS)}; policy options: {known})",
                reason="unknown_option",
            )
