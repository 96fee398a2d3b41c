"""`corepin.allocate(...)`: the Python entry point for one decision.

Options are "name" / "name=value" strings (as `corepin allocate --option`), or a mapping.
Request options understood by every policy:
- `level=cpu|core|l3|numa|socket` exclusiveness level (default cpu),
- `workload=memory-bound|cpu-bound|io-bound|best-effort` workload family,
- `smt=auto|whole-cores|spread` SMT preference,
- `numa=LIST` preferred NUMA node ids (e.g. `numa=1` or `numa=0-1`),
- `prefer-isolated[=true|false]` isolated CPUs first (default true),
- `shared[=true|false]` a shared (non-exclusive) request,
- `near=CPUS` CPUs to run near (a device's local CPUs; `corepin.allocation.near`): preferred,
- `near-strict[=true|false]` only the `near` CPUs (exit 3 when they cannot be had).
Every other option is passed to the policy, which rejects the ones it does not know.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from corepin.allocation.policies import DEFAULT_POLICY, get_policy
from corepin.allocation.types import REQUEST_OPTIONS, Decision, Request, option_flag
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CPUSetParseError, RequestError
from corepin.topology.model import Topology

GENERIC_OPTIONS: Final = REQUEST_OPTIONS

OptionsArg = Iterable[str] | Mapping[str, str | bool | int]


def parse_options(options: OptionsArg) -> dict[str, str]:
    """Normalise options to {name: value}; a bare "name" means "name=true"."""
    out: dict[str, str] = {}
    if isinstance(options, str):
        options = [options]
    if isinstance(options, Mapping):
        for name, value in options.items():
            if not isinstance(name, str) or not name:
                raise RequestError(
                    f"option name must be a string, got {name!r}", reason="bad_option"
                )
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
        return out
    for item in options:
        if not isinstance(item, str):
            raise RequestError(f"option must be a string, got {item!r}", reason="bad_option")
        name, sep, value = item.partition("=")
        name = name.strip()
        if not name:
            raise RequestError(f"option {item!r} has no name", reason="bad_option")
        if name in out:
            raise RequestError(f"option {name!r} is given twice", reason="bad_option")
        out[name] = value.strip() if sep else "true"
    return out


def build_request(count: int, options: OptionsArg = ()) -> Request:
    """A Request for `count` CPUs from generic options; the rest stay in `Request.options`."""
    opts = parse_options(options)
    numa_hint = _set_option(opts, "numa", "a list of NUMA node ids")
    near = _set_option(opts, "near", "a CPU list")
    if near is not None and not near:
        raise RequestError("option near= names no CPU", reason="bad_option_value")
    workload = opts.get("workload") or None
    policy_opts = {k: v for k, v in opts.items() if k not in GENERIC_OPTIONS}
    return Request(
        count=count,
        exclusive=not option_flag(opts, "shared"),
        level=opts.get("level", "cpu"),
        numa_hint=numa_hint,
        workload=workload,
        smt=opts.get("smt", "auto"),
        prefer_isolated=option_flag(opts, "prefer-isolated") if "prefer-isolated" in opts else True,
        options=policy_opts,
        near=near,
        near_strict=option_flag(opts, "near-strict"),
    )


def _set_option(opts: Mapping[str, str], name: str, what: str) -> CPUSet | None:
    """Option `name` as a CPU list form (None when not given); RequestError naming it."""
    if name not in opts:
        return None
    try:
        return CPUSet.parse(opts[name])
    except CPUSetParseError as exc:
        raise RequestError(
            f"option {name}={opts[name]!r} is not {what}: {exc.problem}",
            reason="bad_option_value",
        ) from None


def check_request(topology: Topology, request: Request) -> Request:
    """`request`, checked against `topology`: RequestError naming what this machine does not
    have (a NUMA hint naming nodes it lacks)."""
    if request.numa_hint is not None:
        known = CPUSet(topology.numa_node_ids())
        unknown = request.numa_hint - known
        if unknown:
            raise RequestError(
                f"option numa={request.numa_hint} names NUMA node(s) {unknown} that this "
                f"machine does not have (NUMA nodes with CPUs: {known or 'none'})",
                reason="bad_option_value",
            )
    if request.near is not None:
        outside = request.near - topology.present_cpus
        if outside:
            raise RequestError(
                f"option near={request.near} names CPU(s) {outside} that this machine does not "
                f"have (CPUs: {topology.present_cpus})",
                reason="bad_option_value",
            )
    return request


def check_available(topology: Topology, available: CPUSet | str | None) -> CPUSet:
    """The available set (default: all online CPUs); RequestError naming CPUs that are not
    online CPUs of the topology."""
    if available is None:
        return topology.online_cpus
    if isinstance(available, str):
        available = CPUSet.parse(available)
    if not isinstance(available, CPUSet):
        raise RequestError(f"available must be a CPUSet, got {available!r}", reason="bad_available")
    outside = available - topology.present_cpus
    if outside:
        raise RequestError(
            f"available CPUs {outside} are outside the topology (it has CPUs "
            f"{topology.present_cpus})",
            reason="bad_available",
        )
    offline = available - topology.online_cpus
    if offline:
        raise RequestError(f"available CPUs {offline} are offline", reason="bad_available")
    return available


def decide(
    topology: Topology,
    count: int,
    *,
    available: CPUSet | str | None = None,
    policy: str = DEFAULT_POLICY,
    options: OptionsArg = (),
) -> Decision:
    """The full Decision (CPUs, mems, reserved, explanation) for `count` CPUs."""
    request = check_request(topology, build_request(count, options))
    chosen = get_policy(policy)
    return chosen.decide(topology, request, check_available(topology, available))


def allocate(
    topology: Topology,
    count: int,
    *,
    available: CPUSet | str | None = None,
    policy: str = DEFAULT_POLICY,
    options: OptionsArg = (),
) -> CPUSet:
    """The CPUs `policy` chooses for `count` CPUs out of `available` (default: all online).

    Raises RequestError (exit 2) for bad input and AllocationError (exit 3, `.reason` such as
    "not_enough_cpus", "smt_alignment", "level_unsatisfiable") when it cannot be satisfied.
    """
    return decide(topology, count, available=available, policy=policy, options=options).cpus
