"""Tests for replaying traces with rebalancing (`replay(..., rebalance=True)`) and for
`corepin simulate --rebalance`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.policies import get_policy
from corepin.allocation.rebalance import Alignment, Move, plan_moves
from corepin.allocation.simulate import DecisionRecord, SimulationError, parse_trace, replay
from corepin.allocation.tracegen import ChurnOptions, generate_trace
from corepin.allocation.types import Decision, Request
from corepin.cli.main import main
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError
from corepin.testing.machines import named
from corepin.topology.model import CPUInfo, Topology
from support.budget import examples


def two_numa_smt() -> Topology:
    """1 socket, 2 NUMA nodes (one L3 each), 4 cores per node, SMT 2: 16 CPUs.

    NUMA 0 = cores 0-3 (CPUs 0-3 + siblings 8-11), NUMA 1 = cores 4-7 (CPUs 4-7 + 12-15).
    """
    return Topology(
        [
            CPUInfo(core + 8 * thread, socket=0, numa=core // 4, l3=core // 4, l2=core, core=core)
            for core in range(8)
            for thread in range(2)
        ],
        name="two-numa-smt",
    )


@dataclass
class LowestFirst:
    """A naive policy: the n lowest available CPU ids (it straddles nodes readily)."""

    name: str = "lowest-first"

    def decide(self, topology: Topology, request: Request, available: CPUSet) -> Decision:
        if len(available) < request.count:
            raise AllocationError("not enough", reason="not_enough_cpus")
        cpus = available.lowest(request.count)
        return Decision(cpus, topology.mems_of(cpus), cpus, self.name)


#: x takes CPUs 0-1, a gets 2-5 (both nodes); once x is gone, a fits in node 0 (CPUs 0-3).
STRADDLE = [
    {"op": "add", "id": "x", "cpus": 2},
    {"op": "add", "id": "a", "cpus": 4},
    {"op": "remove", "id": "x"},
]


class TestReplayWithRebalancing:
    def test_a_straddling_allocation_moves_once_a_node_frees_and_counts_as_aligned_after(
        self,
    ) -> None:
        topo, trace = two_numa_smt(), parse_trace({"events": STRADDLE})
        seen: list[tuple[int, Move]] = []
        plain = replay(topo, trace, LowestFirst())
        moved = replay(
            topo, trace, LowestFirst(), rebalance=True, on_move=lambda i, m: seen.append((i, m))
        )
        assert [(i, m.id, m.old, m.new) for i, m in seen] == [
            (2, "a", CPUSet.range(2, 5), CPUSet.range(0, 3))
        ]
        assert (plain.moves, moved.moves) == (0, 1)
        # CPU-time: after event 0 x (2 CPUs); after event 1 x and a (6); after event 2 a (4).
        assert plain.exclusive_cpu_time == moved.exclusive_cpu_time == 12
        assert plain.numa_aligned_cpu_time == 2 + 2 + 0
        assert moved.numa_aligned_cpu_time == 2 + 2 + 4, "a counts as aligned after its move"
        assert (plain.numa_aligned_time_ratio, moved.numa_aligned_time_ratio) == (0.3333, 0.6667)
        assert plain.numa_aligned_ratio == moved.numa_aligned_ratio == 0.5, (
            "the admission-time ratios judge allocations as admitted, with or without moves"
        )

    def test_without_rebalancing_the_planner_is_never_asked(self) -> None:
        def planner(*args: Any, **kwargs: Any) -> tuple[Move, ...]:
            raise AssertionError("planner called")

        replay(two_numa_smt(), parse_trace({"events": STRADDLE}), LowestFirst(), planner=planner)

    def test_the_limit_and_the_policy_options_reach_the_planner(self) -> None:
        asked: list[tuple[int | None, Any]] = []

        def planner(*args: Any, **kwargs: Any) -> tuple[Move, ...]:
            asked.append((kwargs["limit"], kwargs["options"]))
            return plan_moves(*args, **kwargs)

        replay(
            two_numa_smt(),
            parse_trace({"events": STRADDLE}),
            LowestFirst(),
            rebalance=True,
            rebalance_limit=1,
            planner=planner,
            options={"some": "thing"},
        )
        assert asked and all(got == (1, {"some": "thing"}) for got in asked)

    def test_a_planner_moving_onto_held_cpus_is_reported_as_a_bug(self) -> None:
        def bad(*args: Any, **kwargs: Any) -> tuple[Move, ...]:
            a = next((m for m in args[2] if m.id == "a"), None)
            if a is None:
                return ()
            new = CPUSet.range(0, 3)  # x still holds 0-1
            return (Move("a", a.cpus, new, new, Alignment(2, 2, 4), Alignment(1, 1, 4)),)

        events = [*STRADDLE[:2], {"op": "add", "id": "y", "cpus": 1}]
        with pytest.raises(SimulationError, match="after trace event 1 the planner moved 'a'"):
            replay(
                two_numa_smt(),
                parse_trace({"events": events}),
                LowestFirst(),
                rebalance=True,
                planner=bad,
            )

    def test_the_json_result_keeps_every_key_and_adds_the_rebalancing_ones(self) -> None:
        out = replay(
            two_numa_smt(), parse_trace({"events": STRADDLE}), LowestFirst(), rebalance=True
        ).to_json()
        kept = ["admitted", "rejected", "numa_aligned_ratio", "llc_aligned_ratio"]
        kept += ["full_core_ratio", "rejection_reasons", "peak_withheld_cpus", "seconds"]
        for key in [*kept, "events_per_second"]:
            assert key in out
        assert out["rebalance"] is True and out["moves"] == 1
        assert out["exclusive_cpu_time"] == 12
        assert out["numa_aligned_time_ratio"] == out["llc_aligned_time_ratio"] == 0.6667


@settings(max_examples=examples(20))
@given(
    seed=st.integers(0, 2**31),
    machine=st.sampled_from(["dual_socket_ht", "multi_l3_per_numa", "sixteen_numa"]),
    policy_name=st.sampled_from(["topology-aware", "kubelet-static", "workload-aware"]),
    levels=st.booleans(),
)
def test_a_rebalanced_replay_never_puts_two_live_allocations_on_one_cpu(
    seed: int, machine: str, policy_name: str, levels: bool
) -> None:
    topo = named(machine)
    trace = parse_trace(
        generate_trace(topo, seed=seed, options=ChurnOptions(events=300, levels=levels))
    )
    live: dict[str, CPUSet] = {}
    steps: list[tuple[int, str, CPUSet | None, CPUSet]] = []  # event, id, old, new CPUs

    def admitted(record: DecisionRecord) -> None:
        event = trace.events[record.event]
        if record.cpus is not None and not event.shared and event.workload != "best-effort":
            steps.append((record.event, record.id, None, record.cpus))

    def moved(index: int, move: Move) -> None:
        steps.append((index, move.id, move.old, move.new))

    policy = get_policy(policy_name)
    result = replay(topo, trace, policy, rebalance=True, on_decision=admitted, on_move=moved)
    assert result.moves == sum(1 for s in steps if s[2] is not None) <= 2 * len(trace.events)
    by_event: dict[int, list[tuple[int, str, CPUSet | None, CPUSet]]] = {}
    for step in steps:
        by_event.setdefault(step[0], []).append(step)
    for index, event in enumerate(trace.events):
        if event.op == "remove":
            live.pop(event.id, None)
        for _, ident, old, new in by_event.get(index, []):
            if old is not None:
                assert live[ident] == old, "a move starts from where the allocation is"
            others = [cpus for other, cpus in live.items() if other != ident]
            assert all(new.isdisjoint(cpus) for cpus in others), (index, ident)
            live[ident] = new
    if not levels and policy_name != "workload-aware":
        # Without levels, these two admit by how many CPUs are free, not which (workload-aware
        # may want idle whole cores, so where the others sit matters to it).
        plain = replay(topo, trace, policy)
        assert (result.admitted, result.rejected) == (plain.admitted, plain.rejected)
        assert result.exclusive_cpu_time == plain.exclusive_cpu_time


# ------------------------------------------------------------------------------ CLI
def write_inputs(tmp_path: Path) -> tuple[str, str]:
    topo = named("multi_l3_per_numa")
    topo_path = tmp_path / "topology.json"
    topo_path.write_text(json.dumps(topo.to_json()), encoding="utf-8")
    trace = generate_trace(topo, seed=5, options=ChurnOptions(events=600, levels=False))
    trace_path = tmp_path / "trace.json"
    trace_path.write_text(json.dumps(trace), encoding="utf-8")
    return str(topo_path), str(trace_path)


class TestSimulateRebalanceCommand:
    def test_json_holds_each_policy_without_and_with_rebalancing_and_the_gain(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        topo, trace = write_inputs(tmp_path)
        args = ["simulate", "--topology", topo, "--trace", trace, "--policy", "kubelet-static"]
        assert main([*args, "--rebalance", "-o", "json"]) == 0
        [data] = json.loads(capsys.readouterr().out)
        plain, moved = data, data["rebalanced"]
        assert (plain["rebalance"], moved["rebalance"]) == (False, True)
        assert plain["admitted"] == moved["admitted"] and plain["moves"] == 0
        assert moved["moves"] > 0, "kubelet-static leaves allocations worth moving on this trace"
        gain = data["gain"]
        assert gain["moves"] == moved["moves"]
        assert gain["numa_aligned_time"] == pytest.approx(
            moved["numa_aligned_time_ratio"] - plain["numa_aligned_time_ratio"], abs=1e-4
        )
        assert gain["llc_aligned_time"] > 0
        assert main([*args, "-o", "json"]) == 0
        [alone] = json.loads(capsys.readouterr().out)
        timing = ("seconds", "events_per_second", "rebalanced", "gain")
        assert {k: v for k, v in alone.items() if k not in timing} == {
            k: v for k, v in plain.items() if k not in timing
        }, "the replay without rebalancing is the plain replay"

    def test_the_table_adds_a_rebalancing_section_under_the_usual_one(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        topo, trace = write_inputs(tmp_path)
        args = ["simulate", "--topology", topo, "--trace", trace, "--rebalance"]
        assert main([*args, "--rebalance-limit", "1"]) == 0
        out = capsys.readouterr().out
        usual, _, section = out.partition("Rebalancing (without -> with):")
        assert "NUMA-ALIGNED" in usual and "LLC-ALIGNED" in usual
        lines = section.strip().splitlines()
        assert lines[0].split()[:3] == ["POLICY", "ADMITTED", "MOVES"]
        assert [line.split()[0] for line in lines[1:]] == [
            "topology-aware",
            "kubelet-static",
            "workload-aware",
        ]
        assert "->" in lines[1]

    @pytest.mark.parametrize(
        ("extra", "message"),
        [
            pytest.param(["--rebalance-limit", "2"], "needs --rebalance", id="a limit alone"),
            pytest.param(
                ["--rebalance", "--rebalance-limit", "0"], "positive", id="a limit of zero"
            ),
        ],
    )
    def test_a_rebalance_limit_that_makes_no_sense_exits_2(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        extra: list[str],
        message: str,
    ) -> None:
        topo, trace = write_inputs(tmp_path)
        assert main(["simulate", "--topology", topo, "--trace", trace, *extra]) == 2
        assert message in capsys.readouterr().err

    def test_rebalance_with_generate_is_a_usage_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        topo, _ = write_inputs(tmp_path)
        assert main(["simulate", "--generate", "--topology", topo, "--rebalance"]) == 2
        assert "--rebalance" in capsys.readouterr().err
