"""Validation of a restored state against the live topology (done at every start).

`validate(state, topology, reserved=None)` returns `(repaired_state, changes)`:

Safe, repaired and logged (one `key=value` line per change, logger `corepin.state`):
- the topology fingerprint or the online CPU set changed: adopt the live one; the shared pool
  (derived) loses offline CPUs and gains new online ones;
- reserved CPUs that went offline are dropped from the reserved set;
- CPUs withheld by an exclusiveness level (outside the assignment's own `cpus`) that went
  offline are dropped from that assignment's `withheld` set;
- the isolated CPUs of the live topology are adopted (the shared pool never holds them);
- NUMA mems of exclusive assignments missing or out of date are recomputed from the topology;
- a new reserved set (from configuration) that touches no exclusive assignment is adopted;
- a reservation (CPUs held for a workload yet to come) whose CPUs went offline, became reserved
  or are held by another assignment is dropped: nothing runs on it yet, so nothing is lost but
  the hold.

Not safe, refused with StateError (exit 4) telling the operator what to do:
- an exclusive (or share) assignment lost CPUs (offline or absent): its workload would run on
  CPUs it was never given, or on fewer than it asked for;
- two assignments withhold the same CPUs;
- an assignment holds reserved CPUs (old or newly configured).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corepin.core.cpuset import CPUSet
from corepin.core.errors import StateError
from corepin.core.log import INFO, emit
from corepin.state.model import HostState, fingerprint

if TYPE_CHECKING:
    from corepin.topology.model import Topology


def _cpu_hint(cpus: CPUSet) -> str:
    first = cpus.first()
    return f"echo 1 > /sys/devices/system/cpu/cpu{first}/online"


def _log(changes: list[str]) -> None:
    if not changes:
        return
    for line in changes:
        emit("corepin.state", INFO, "%s", line)


def _drop_broken_reservations(
    state: HostState, online: CPUSet, reserved: CPUSet | None, changes: list[str]
) -> HostState:
    """`state` without the reservations that no longer fit (see the module docstring)."""
    new_reserved = state.reserved if reserved is None else reserved
    for r in list(state.reservations.values()):
        others = [
            a.id
            for a in state.assignments.values()
            if a.holds and a.reservation != r.name and a.withheld & r.withheld
        ]
        if r.cpus - online:
            cause = f"offline cpus={r.cpus - online}"
        elif r.withheld & new_reserved:
            cause = f"reserved cpus={r.withheld & new_reserved}"
        elif others:
            cause = f"held_by={','.join(others)}"
        else:
            continue
        changes.append(f"event=reservation_dropped name={r.name} cpus={r.cpus} cause={cause}")
        state = state.remove_reservation(r.name)
    return state


def validate(
    state: HostState, topology: Topology, *, reserved: CPUSet | None = None
) -> tuple[HostState, list[str]]:
    """Check `state` against the live `topology`; repair what is safe, refuse what is not."""
    online = topology.online_cpus
    problems: list[str] = []
    changes: list[str] = []
    state = _drop_broken_reservations(state, online, reserved, changes)

    # --- exclusive assignments must keep every CPU they were given
    for a in state.assignments.values():
        if not a.holds:
            continue
        lost = a.cpus - online
        if lost:
            absent = lost - topology.present_cpus
            what = "are not present on this machine" if absent == lost else "are offline"
            problems.append(
                f"allocation {a.id!r} ({a.label}) holds CPUs {a.cpus} but CPUs {lost} {what}; "
                f"bring them back online ({_cpu_hint(lost)}) or end that workload and free its "
                "allocation (`corepin reconcile --once` frees allocations of exited processes)"
            )
    for first, second, common in state.overlaps():
        problems.append(
            f"allocations {first!r} and {second!r} both withhold CPUs {common}; stop one "
            "of the two workloads and run `corepin reconcile --once`"
        )
    new_reserved = state.reserved if reserved is None else reserved
    for a in state.assignments.values():
        clash = a.cpus & new_reserved
        if a.holds and clash:
            source = "reserved" if reserved is None else "configured as reserved"
            problems.append(
                f"allocation {a.id!r} holds CPUs {clash} which are {source}; end that workload "
                "or choose reserved CPUs outside it"
            )
    if problems:
        raise StateError(
            "restored state does not fit this machine; corepin changed nothing:\n  - "
            + "\n  - ".join(problems),
            reason="unsafe_state",
        )

    # --- safe repairs
    out = state
    fp = fingerprint(topology)
    old_pool = state.shared_pool
    if state.topology != fp:
        changes.append(f"event=topology_changed old={state.topology or '-'} new={fp}")
    if state.online != online:
        gone = state.online - online
        came = online - state.online
        changes.append(
            f"event=online_changed old={state.online} new={online} "
            f"offline={gone or '-'} added={came or '-'}"
        )
    isolated = topology.isolated_cpus
    if state.isolated != isolated:
        changes.append(f"event=isolated_changed old={state.isolated or '-'} new={isolated or '-'}")
    out = out.evolve(topology=fp, online=online, isolated=isolated)

    if reserved is not None and reserved != state.reserved:
        changes.append(f"event=reserved_changed old={state.reserved} new={reserved}")
        out = out.evolve(reserved=reserved)
    gone_reserved = out.reserved - online
    if gone_reserved:
        changes.append(
            f"event=reserved_dropped cpus={gone_reserved} cause=offline "
            f"old={out.reserved} new={out.reserved - gone_reserved}"
        )
        out = out.evolve(reserved=out.reserved - gone_reserved)

    items = dict(out.assignments)
    for key, a in out.assignments.items():
        if not a.holds:
            continue
        new = a
        extra_gone = a.withheld - online
        if extra_gone:
            changes.append(
                f"event=withheld_dropped id={a.id} cpus={extra_gone} cause=offline "
                f"old={a.withheld} new={a.withheld - extra_gone}"
            )
            new = new.evolve(withheld=a.withheld - extra_gone)
        mems = topology.mems_of(a.cpus)
        if mems != a.mems:
            changes.append(f"event=mems_recomputed id={a.id} old={a.mems or '-'} new={mems}")
            new = new.evolve(mems=mems)
        if new is not a:
            items[key] = new
    out = out.evolve(assignments=items)

    new_pool = out.shared_pool
    if new_pool != old_pool:
        changes.append(
            f"event=shared_pool_changed old={old_pool or '-'} new={new_pool or '-'} "
            f"removed={(old_pool - new_pool) or '-'} added={(new_pool - old_pool) or '-'}"
        )
    _log(changes)
    return out, changes
