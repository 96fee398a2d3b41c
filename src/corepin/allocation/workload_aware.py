"""Policy `workload-aware`: placement by workload family (actimanager's families).

- `memory-bound`: spread the CPUs evenly over the NUMA nodes (alternating sockets) so the workload
  gets the memory bandwidth of every node it touches; its `mems` are all those nodes. Option
  `whole-sockets` (or level=socket) takes whole sockets exclusively, the fewest that hold it.
- `cpu-bound`: distinct idle physical cores, one thread per core, on one socket; the idle
  siblings are withheld with the decision (the decision reserves at level `core`), so no one
  else's work runs on the other thread of those cores.
- `io-bound`: packed: fills the SMT siblings of the same cores (the fewest cores, partly used
  cores first), on the fewest NUMA nodes and L3 instances.
- `best-effort`: shares CPUs: returns the n shared-pool CPUs that the fewest others already
  share (usage counts from the `usage` keyword of `decide`, or option `usage=CPU:COUNT,...`),
  ties by lowest id. Nothing is withheld.
- no family: the `topology-aware` choice.

A request with CPUs to run near (`Request.near`) gets its family's placement inside them first
(`corepin.allocation.near`).

Deterministic: every choice is ordered by counts and then by lowest id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from corepin.allocation.levels import TopologyIndex, index_of
from corepin.allocation.near import decide_near
from corepin.allocation.topology_aware import Selector, TopologyAwarePolicy, mems_of
from corepin.allocation.types import (
    LEVELS,
    Decision,
    Request,
    Step,
    check_options,
    option_flag,
)
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, RequestError
from corepin.topology.model import Topology

NAME: Final = "workload-aware"
OPTIONS: Final = ("whole-sockets", "usage", "allow-isolated", "full-pcpus-only")


def parse_usage(text: str) -> dict[int, int]:
    """`"0:3,4:1"` -> {0: 3, 4: 1}: how many others already share each CPU."""
    out: dict[int, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        cpu, sep, count = item.partition(":")
        if not sep or not cpu.strip().isdigit() or not count.strip().isdigit():
            raise RequestError(
                f"option usage takes CPU:COUNT pairs separated by commas, got {item!r}",
                reason="bad_option_value",
            )
        out[int(cpu)] = int(count)
    return out


def _stronger(a: str, b: str) -> str:
    return a if LEVELS.index(a) >= LEVELS.index(b) else b


def _need_whole_units(usable: int, n: int, level: str) -> None:
    """AllocationError unless the CPUs of entirely free `level` units can hold `n`."""
    if usable.bit_count() < n:
        raise AllocationError(
            f"cannot reserve whole {level}s for {n} CPUs: only {usable.bit_count()} CPUs "
            f"are in entirely free {level}s",
            reason="level_unsatisfiable",
        )


def _decision(idx: TopologyIndex, cpus: int, level: str, steps: list[Step]) -> Decision:
    """The decision for `cpus`: their NUMA nodes as mems, the rest of their `level` units
    withheld with them."""
    return Decision(
        CPUSet.from_bits(cpus),
        mems_of(idx, cpus),
        CPUSet.from_bits(idx.withheld_mask(level, cpus)),
        NAME,
        tuple(steps),
    )


class WorkloadAwarePolicy:
    """Placement by workload family (see the module docstring)."""

    name: str = NAME

    def decide(
        self,
        topology: Topology,
        request: Request,
        available: CPUSet,
        *,
        usage: Mapping[int, int] | None = None,
    ) -> Decision:
        if request.near is not None:  # never best-effort: its usage does not matter
            return decide_near(self, topology, request, available)
        check_options(request.options, OPTIONS, NAME)
        idx = index_of(topology)
        avail = available.bits & idx.online
        family = request.workload
        if family == "best-effort":
            counts = dict(usage or {})
            if "usage" in request.options:
                counts.update(parse_usage(request.options["usage"]))
            return self._best_effort(idx, avail, request, counts)
        if family is None or not request.exclusive:
            plain = {k: v for k, v in request.options.items() if k in ("full-pcpus-only",)}
            if "allow-isolated" in request.options:
                plain["allow-isolated"] = request.options["allow-isolated"]
            inner = Request(
                request.count,
                exclusive=request.exclusive,
                level=request.level,
                numa_hint=request.numa_hint,
                smt=request.smt,
                prefer_isolated=request.prefer_isolated,
                options=plain,
            )
            d = TopologyAwarePolicy().decide(topology, inner, available)
            why = Step("workload", "none", "no workload family: the topology-aware choice")
            return Decision(d.cpus, d.mems, d.withheld, NAME, (why, *d.explanation))
        n = request.count
        if avail.bit_count() < n:
            raise AllocationError(
                f"not enough CPUs: requested {n}, available {avail.bit_count()}",
                reason="not_enough_cpus",
            )
        if idx.isolated and not request.prefer_isolated:
            without = avail & ~idx.isolated
            if without.bit_count() >= n:
                avail = without
        if family == "memory-bound":
            return self._memory_bound(idx, avail, request)
        if family == "cpu-bound":
            return self._cpu_bound(idx, avail, request)
        return self._io_bound(idx, avail, request)

    def place_best_effort(
        self,
        topology: Topology,
        request: Request,
        pool: CPUSet,
        usage: Mapping[int, int] | None,
    ) -> Decision:
        """A best-effort request placed inside the shared `pool` by `usage`
        (`corepin.allocation.types.BestEffortPlacer`): the same as `decide`."""
        return self.decide(topology, request, pool, usage=usage)

    # ------------------------------------------------------------------ memory-bound
    def _memory_bound(self, idx: TopologyIndex, avail: int, request: Request) -> Decision:
        n = request.count
        level = request.level
        if option_flag(request.options, "whole-sockets"):
            level = "socket"
        steps: list[Step] = [
            Step("workload", "memory-bound", "spread over NUMA nodes for memory bandwidth")
        ]
        usable = idx.free_units_mask(level, avail)
        if level == "socket":
            # the fewest whole free sockets that hold n, largest first then best fit
            free_socks = [
                (m.bit_count(), sid, m)
                for sid, m in zip(idx.socket_ids, idx.socket_masks, strict=True)
                if m & usable == m
            ]
            if sum(f for f, _, _ in free_socks) < n:
                raise AllocationError(
                    f"cannot take whole sockets for {n} CPUs: only "
                    f"{sum(f for f, _, _ in free_socks)} CPUs are in entirely free sockets",
                    reason="level_unsatisfiable",
                )
            chosen = 0
            need = n
            names = []
            pool = sorted(free_socks, key=lambda x: (-x[0], x[1]))
            while need > 0:
                fits = [s for s in pool if s[0] >= need]
                pick = min(fits, key=lambda x: (x[0], x[1])) if fits else pool[0]
                pool.remove(pick)
                chosen |= pick[2]
                names.append(str(pick[1]))
                need -= pick[0]
            usable &= chosen
            steps.append(
                Step("socket", f"sockets {','.join(names)}", "the fewest entirely free sockets")
            )
        else:
            _need_whole_units(usable, n, level)
        units = idx.numa
        frees = [(u.mask & usable).bit_count() for u in units]
        # interleave sockets: node 0 of socket 0, node 0 of socket 1, node 1 of socket 0, ...
        per_socket: dict[int, list[int]] = {}
        for i, u in enumerate(units):
            if frees[i]:
                per_socket.setdefault(u.socket, []).append(i)
        order: list[int] = []
        depth = max((len(v) for v in per_socket.values()), default=0)
        for d in range(depth):
            for s in sorted(per_socket):
                if d < len(per_socket[s]):
                    order.append(per_socket[s][d])
        use = order[: min(n, len(order))]
        share = {i: 0 for i in use}
        need = n
        # water-fill: the smallest nodes first, each gets its even share capped by its free CPUs
        left = len(use)
        for i in sorted(use, key=lambda i: (frees[i], i)):
            give = min(frees[i], need // left)
            share[i] = give
            need -= give
            left -= 1
        while need > 0:
            progressed = False
            for i in use + order[len(use) :]:
                if need == 0:
                    break
                if share.get(i, 0) < frees[i]:
                    share[i] = share.get(i, 0) + 1
                    need -= 1
                    progressed = True
            if not progressed:
                raise AllocationError(
                    f"not enough CPUs: requested {n}, usable {usable.bit_count()}",
                    reason="not_enough_cpus",
                )
        cpus = 0
        sel = Selector(idx, usable)
        for i in sorted(share):
            if share[i]:
                cpus |= sel.in_numa(units[i], share[i])
        placed = ", ".join(f"{share[i]} on node {units[i].id}" for i in sorted(share) if share[i])
        steps.append(Step("numa", placed, "even shares, sockets alternating"))
        return _decision(idx, cpus, level, steps)

    # ------------------------------------------------------------------ cpu-bound
    def _cpu_bound(self, idx: TopologyIndex, avail: int, request: Request) -> Decision:
        n = request.count
        level = _stronger(request.level, "core")
        usable = idx.free_units_mask(level, avail)
        # one thread (the lowest CPU) of every entirely idle core
        firsts = 0
        for c in idx.core_masks:
            if c & usable == c:
                firsts |= c & -c
        steps = [
            Step(
                "workload",
                "cpu-bound",
                "distinct idle physical cores, one thread each; siblings are withheld",
            )
        ]
        if firsts.bit_count() < n:
            raise AllocationError(
                f"not enough idle physical cores: {n} needed, {firsts.bit_count()} idle"
                + (f" in entirely free {level}s" if level != "core" else ""),
                reason="not_enough_idle_cores",
            )
        socks = [
            ((firsts & m).bit_count(), sid, m)
            for sid, m in zip(idx.socket_ids, idx.socket_masks, strict=True)
        ]
        fits = [s for s in socks if s[0] >= n]
        if fits:
            count, sid, smask = min(fits, key=lambda s: (s[0], s[1]))
            pool = firsts & smask
            steps.append(Step("socket", f"socket {sid}", f"best fit: {count} idle cores hold {n}"))
        else:
            pool = firsts
            steps.append(
                Step("socket", "several", f"no single socket has {n} idle cores: fewest NUMA")
            )
        sel = Selector(idx, pool, "spread")
        cpus = sel.select(n)
        steps.extend(sel.steps)
        return _decision(idx, cpus, level, steps)

    # ------------------------------------------------------------------ io-bound
    def _io_bound(self, idx: TopologyIndex, avail: int, request: Request) -> Decision:
        n = request.count
        level = request.level
        usable = idx.free_units_mask(level, avail)
        _need_whole_units(usable, n, level)
        sel = Selector(idx, usable, "packed")
        cpus = sel.select(n)
        steps = [
            Step("workload", "io-bound", "packed onto SMT siblings of the fewest cores"),
            *sel.steps,
        ]
        return _decision(idx, cpus, level, steps)

    # ------------------------------------------------------------------ best-effort
    def _best_effort(
        self, idx: TopologyIndex, avail: int, request: Request, usage: Mapping[int, int]
    ) -> Decision:
        n = request.count
        pool = avail
        if not option_flag(request.options, "allow-isolated"):
            pool &= ~idx.isolated
        if pool.bit_count() < n:
            raise AllocationError(
                f"not enough shared CPUs: requested {n}, the shared pool has {pool.bit_count()}",
                reason="not_enough_cpus",
            )
        ranked = sorted(CPUSet.from_bits(pool), key=lambda c: (usage.get(c, 0), c))
        cpus = 0
        for c in ranked[:n]:
            cpus |= 1 << c
        least = usage.get(ranked[0], 0)
        steps = (
            Step(
                "workload",
                "best-effort",
                f"shares the {n} shared-pool CPU(s) the fewest others use "
                f"(least shared: {least} other{'s' if least != 1 else ''}), ties by lowest id",
            ),
        )
        return Decision(CPUSet.from_bits(cpus), mems_of(idx, cpus), CPUSet(), NAME, steps)


__all__ = ["WorkloadAwarePolicy", "parse_usage"]
