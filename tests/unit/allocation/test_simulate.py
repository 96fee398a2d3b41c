"""Tests for the trace replay engine and `corepin simulate`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.simulate import (
    AlignmentMetrics,
    DecisionRecord,
    SimulationError,
    TraceError,
    parse_trace,
    replay,
)
from corepin.allocation.types import Decision, Request
from corepin.cli.main import main
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError
from corepin.topology.model import CPUInfo, Topology
from support.budget import examples
from support.paths import SYSFS_FIXTURES


# ------------------------------------------------------------------------------ topologies
def two_numa_smt() -> Topology:
    """1 socket, 2 NUMA nodes (one L3 each), 4 cores per node, SMT 2: 16 CPUs.

    NUMA 0 = cores 0-3 (CPUs 0-3 + siblings 8-11), NUMA 1 = cores 4-7 (CPUs 4-7 + 12-15).
    """
    cpus = []
    for core in range(8):
        node = core // 4
        for thread in range(2):
            cpus.append(
                CPUInfo(core + 8 * thread, socket=0, numa=node, l3=node, l2=core, core=core)
            )
    return Topology(cpus, name="two-numa-smt")


def two_l3_per_numa() -> Topology:
    """1 NUMA node with 2 L3 caches of 4 single-thread cores each (8 CPUs, no SMT)."""
    return Topology(
        [CPUInfo(c, socket=0, numa=0, l3=c // 4, l2=c, core=c) for c in range(8)],
        name="two-l3",
    )


def write_topology(tmp_path: Path, topology: Topology) -> str:
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(topology.to_json()), encoding="utf-8")
    return str(path)


def write_trace(tmp_path: Path, events: list[dict[str, Any]], name: str = "trace.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"events": events}), encoding="utf-8")
    return str(path)


@dataclass
class LowestFirst:
    """A deliberately naive policy for exercising the replay bookkeeping: the n lowest
    available CPU ids; level "numa" withholds the rest of each NUMA node it touches."""

    name: str = "lowest-first"

    def decide(self, topology: Topology, request: Request, available: CPUSet) -> Decision:
        if len(available) < request.count:
            raise AllocationError(
                f"{request.count} CPUs asked, {len(available)} available",
                reason="not_enough_cpus",
            )
        cpus = available.lowest(request.count)
        reserved = cpus
        if request.level == "numa":
            reserved = topology.cpus_in_numa_nodes(*topology.numa_nodes_in(cpus)) & available
        return Decision(cpus, topology.mems_of(cpus), reserved, self.name)


@dataclass
class Greedy:
    """Hands out CPUs whether or not they are available: a broken policy."""

    name: str = "greedy"

    def decide(self, topology: Topology, request: Request, available: CPUSet) -> Decision:
        cpus = topology.online_cpus.lowest(request.count)
        return Decision(cpus, topology.mems_of(cpus), cpus, self.name)


# ------------------------------------------------------------------------------ metrics
class TestAlignmentMetrics:
    def test_four_cpus_spanning_two_numa_nodes_are_not_numa_aligned(self) -> None:
        metrics = AlignmentMetrics(two_numa_smt())
        numa, llc, _ = metrics.classify(CPUSet.of(2, 3, 4, 5))
        assert not numa
        assert not llc

    def test_four_cpus_as_two_whole_cores_in_one_node_are_aligned_everywhere(self) -> None:
        metrics = AlignmentMetrics(two_numa_smt())
        assert metrics.classify(CPUSet.of(0, 1, 8, 9)) == (True, True, True)

    def test_four_cpus_from_four_different_cores_are_not_full_core(self) -> None:
        metrics = AlignmentMetrics(two_numa_smt())
        assert metrics.classify(CPUSet.of(0, 1, 2, 3)) == (True, True, False)

    def test_an_odd_count_may_leave_exactly_one_partial_core(self) -> None:
        metrics = AlignmentMetrics(two_numa_smt())
        assert metrics.classify(CPUSet.of(0, 8, 1))[2]
        assert not metrics.classify(CPUSet.of(0, 1, 2))[2]

    def test_a_single_cpu_is_full_core_on_an_smt_machine(self) -> None:
        assert AlignmentMetrics(two_numa_smt()).classify(CPUSet.of(5)) == (True, True, True)

    def test_more_cpus_than_a_node_holds_are_aligned_when_they_span_the_minimum(self) -> None:
        metrics = AlignmentMetrics(two_numa_smt())
        assert metrics.fewest(9) == (2, 2)
        assert metrics.classify(CPUSet.range(0, 8))[0]

    def test_llc_alignment_is_judged_against_the_fewest_l3_instances(self) -> None:
        metrics = AlignmentMetrics(two_l3_per_numa())
        assert metrics.fewest(4) == (1, 1)
        assert metrics.classify(CPUSet.range(4, 7)) == (True, True, True)
        assert metrics.classify(CPUSet.range(2, 5)) == (True, False, True)

    def test_without_smt_every_allocation_is_full_core(self) -> None:
        metrics = AlignmentMetrics(two_l3_per_numa())
        assert metrics.smt == 1
        assert metrics.classify(CPUSet.of(1, 3, 6))[2]


# ------------------------------------------------------------------------------ parsing
class TestTraceValidation:
    @pytest.mark.parametrize(
        ("events", "index", "field"),
        [
            ([{"op": "resize", "id": "a"}], 0, "op"),
            ([{"op": "add", "id": "a", "cpus": 0}], 0, "cpus"),
            ([{"op": "add", "id": "a", "cpus": -2}], 0, "cpus"),
            ([{"op": "add", "id": "a", "cpus": 1.5}], 0, "cpus"),
            ([{"op": "add", "id": "a", "cpus": "4"}], 0, "cpus"),
            ([{"op": "add", "id": "a", "cpus": True}], 0, "cpus"),
            ([{"op": "add", "id": "a"}], 0, "cpus"),
            ([{"op": "add", "id": "a", "cpus": 2, "level": "rack"}], 0, "level"),
            ([{"op": "add", "id": "a", "cpus": 2, "workload": "gpu-bound"}], 0, "workload"),
            ([{"op": "add", "id": "a", "cpus": 2, "shared": "yes"}], 0, "shared"),
            ([{"op": "add", "id": "", "cpus": 2}], 0, "id"),
            ([{"op": "add", "id": "a", "cpus": 2, "colour": "red"}], 0, "colour"),
            (
                [
                    {"op": "add", "id": "a", "cpus": 2},
                    {"op": "add", "id": "b", "cpus": 2},
                    {"op": "add", "id": "a", "cpus": 1},
                ],
                2,
                "id",
            ),
        ],
        ids=[
            "an unknown op is rejected naming the op field",
            "zero cpus is rejected",
            "negative cpus are rejected",
            "fractional cpus are rejected",
            "cpus given as a string are rejected",
            "cpus given as a boolean are rejected",
            "an add without cpus is rejected",
            "an unknown exclusiveness level is rejected",
            "an unknown workload family is rejected",
            "a non-boolean shared flag is rejected",
            "an empty id is rejected",
            "an unknown field is rejected",
            "a second add of a live id is rejected at the index of the duplicate",
        ],
    )
    def test_bad_event_names_index_and_field(
        self, events: list[dict[str, Any]], index: int, field: str
    ) -> None:
        with pytest.raises(TraceError) as info:
            parse_trace({"events": events})
        assert info.value.index == index
        assert info.value.field == field
        assert f"trace event {index} field {field!r}" in str(info.value)
        assert info.value.exit_code == 2

    def test_re_adding_an_id_after_its_remove_is_allowed(self) -> None:
        trace = parse_trace(
            {
                "events": [
                    {"op": "add", "id": "a", "cpus": 1},
                    {"op": "remove", "id": "a"},
                    {"op": "add", "id": "a", "cpus": 2},
                ]
            }
        )
        assert [e.op for e in trace.events] == ["add", "remove", "add"]

    def test_a_trace_without_an_events_list_is_rejected(self) -> None:
        with pytest.raises(TraceError, match="events"):
            parse_trace({"event": []})
        with pytest.raises(TraceError):
            parse_trace([])

    def test_the_json_form_round_trips(self) -> None:
        data = {
            "events": [
                {"op": "add", "id": "ns/p/c", "cpus": 4, "level": "core", "workload": "cpu-bound"},
                {"op": "add", "id": "ns/p/s", "cpus": 1, "shared": True},
                {"op": "remove", "id": "ns/p/c"},
            ]
        }
        assert parse_trace(data).to_json() == data


# ------------------------------------------------------------------------------ replay
class TestReplay:
    def test_removes_free_cpus_and_unknown_removes_are_ignored(self) -> None:
        topo = two_numa_smt()
        trace = parse_trace(
            {
                "events": [
                    {"op": "add", "id": "a", "cpus": 10},
                    {"op": "add", "id": "b", "cpus": 8},
                    {"op": "remove", "id": "never-admitted"},
                    {"op": "remove", "id": "b"},  # b was rejected: ignored
                    {"op": "remove", "id": "a"},
                    {"op": "add", "id": "c", "cpus": 16},
                ]
            }
        )
        records: list[DecisionRecord] = []
        result = replay(topo, trace, LowestFirst(), on_decision=records.append)
        assert (result.admitted, result.rejected) == (2, 1)
        assert result.reasons == {"not_enough_cpus": 1}
        assert [(r.event, r.id, r.cpus, r.reason) for r in records] == [
            (0, "a", CPUSet.range(0, 9), None),
            (1, "b", None, "not_enough_cpus"),
            (5, "c", CPUSet.range(0, 15), None),
        ]
        assert result.peak_withheld == 16

    def test_cpus_withheld_by_a_level_are_unavailable_until_the_remove(self) -> None:
        topo = two_numa_smt()
        events = [
            {"op": "add", "id": "whole-node", "cpus": 1, "level": "numa"},
            {"op": "add", "id": "nine", "cpus": 9},
            {"op": "remove", "id": "whole-node"},
            {"op": "add", "id": "nine-again", "cpus": 9},
        ]
        records: list[DecisionRecord] = []
        replay(topo, parse_trace({"events": events}), LowestFirst(), on_decision=records.append)
        assert records[1].reason == "not_enough_cpus"  # only NUMA 1's 8 CPUs were left
        assert records[2].cpus is not None and len(records[2].cpus) == 9

    def test_shared_adds_take_no_cpus_and_fail_only_on_an_empty_shared_pool(self) -> None:
        topo = two_numa_smt()
        events = [
            {"op": "add", "id": "all", "cpus": 16},
            {"op": "add", "id": "s1", "cpus": 1, "shared": True},
            {"op": "remove", "id": "all"},
            {"op": "add", "id": "s2", "cpus": 2, "shared": True},
            {"op": "add", "id": "all-again", "cpus": 16},
        ]
        records: list[DecisionRecord] = []
        result = replay(
            topo, parse_trace({"events": events}), LowestFirst(), on_decision=records.append
        )
        assert (result.admitted_shared, result.admitted_exclusive, result.rejected) == (1, 1, 2)
        assert result.reasons == {"shared_pool_empty": 1, "shared_pool_exhausted": 1}
        assert records[2].cpus == topo.online_cpus, "a shared add gets the whole shared pool"
        assert records[3].reason == "shared_pool_exhausted", (
            "as in host mode, an exclusive add never empties the pool of a live shared workload"
        )

    def test_ratios_count_admitted_exclusive_allocations_only(self) -> None:
        topo = two_numa_smt()
        events = [
            {"op": "add", "id": "a", "cpus": 2},  # CPUs 0-1: two half cores, one node
            {"op": "add", "id": "b", "cpus": 4},  # CPUs 2-5: spans both nodes
            {"op": "add", "id": "s", "cpus": 1, "shared": True},
        ]
        result = replay(topo, parse_trace({"events": events}), LowestFirst())
        assert result.numa_aligned_ratio == 0.5
        assert result.llc_aligned_ratio == 0.5
        assert result.full_core_ratio == 0.0
        out = result.with_seconds(0.5).to_json()
        for key in (
            "admitted",
            "rejected",
            "numa_aligned_ratio",
            "llc_aligned_ratio",
            "full_core_ratio",
            "seconds",
            "events_per_second",
            "rejection_reasons",
        ):
            assert key in out
        assert out["events_per_second"] == 6.0

    def test_a_policy_handing_out_unavailable_cpus_is_reported_as_a_bug(self) -> None:
        events = [{"op": "add", "id": "a", "cpus": 2}, {"op": "add", "id": "b", "cpus": 2}]
        with pytest.raises(SimulationError, match="trace event 1"):
            replay(two_numa_smt(), parse_trace({"events": events}), Greedy())

    def test_progress_is_reported_and_ends_at_the_total(self) -> None:
        events = [{"op": "add", "id": f"a{i}", "cpus": 1} for i in range(10)]
        seen: list[tuple[int, int]] = []
        replay(
            two_numa_smt(),
            parse_trace({"events": events}),
            LowestFirst(),
            progress=lambda d, t: seen.append((d, t)),
            progress_every=4,
        )
        assert seen == [(4, 10), (8, 10), (10, 10)]


# ------------------------------------------------------------------------------ CLI
class TestCLI:
    def test_bad_trace_exits_2_naming_event_and_field(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        topo = write_topology(tmp_path, two_numa_smt())
        trace = write_trace(
            tmp_path,
            [{"op": "add", "id": "a", "cpus": 1}, {"op": "add", "id": "b", "cpus": 0}],
        )
        code = main(["simulate", "--topology", topo, "--trace", trace])
        err = capsys.readouterr().err
        assert code == 2
        assert "trace event 1 field 'cpus'" in err
        assert "Traceback" not in err

    def test_missing_trace_file_exits_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        topo = write_topology(tmp_path, two_numa_smt())
        code = main(["simulate", "--topology", topo, "--trace", str(tmp_path / "nope.json")])
        assert code == 2
        assert "nope.json" in capsys.readouterr().err

    def test_unknown_policy_exits_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        topo = write_topology(tmp_path, two_numa_smt())
        trace = write_trace(tmp_path, [{"op": "add", "id": "a", "cpus": 1}])
        code = main(["simulate", "--topology", topo, "--trace", trace, "--policy", "random"])
        assert code == 2
        assert "random" in capsys.readouterr().err

    def test_no_trace_and_no_generate_is_a_usage_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        topo = write_topology(tmp_path, two_numa_smt())
        assert main(["simulate", "--topology", topo]) == 2
        assert "--trace" in capsys.readouterr().err

    def test_generate_writes_a_valid_trace_file(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        topo = write_topology(tmp_path, two_numa_smt())
        out = tmp_path / "gen.json"
        args = ["simulate", "--generate", "--topology", topo, "--seed", "7", "--events", "300"]
        assert main([*args, "--out", str(out)]) == 0
        trace = parse_trace(json.loads(out.read_text(encoding="utf-8")))
        assert len(trace.events) == 300
        assert main(args) == 0
        assert json.loads(capsys.readouterr().out) == json.loads(out.read_text(encoding="utf-8"))


class TestCLIWithRealPolicies:
    def _run(self, tmp_path: Path, *extra: str) -> tuple[int, str]:
        topo = write_topology(tmp_path, two_numa_smt())
        trace = write_trace(
            tmp_path,
            [
                {"op": "add", "id": "ns/a/c", "cpus": 4},
                {"op": "add", "id": "ns/b/c", "cpus": 2, "level": "core"},
                {"op": "add", "id": "ns/s/c", "cpus": 1, "shared": True},
                {"op": "add", "id": "ns/big/c", "cpus": 64},
                {"op": "remove", "id": "ns/a/c"},
                {"op": "remove", "id": "ns/ghost/c"},
                {"op": "add", "id": "ns/d/c", "cpus": 3, "workload": "cpu-bound"},
            ],
        )
        args = ["simulate", "--topology", topo, "--trace", trace]
        args += ["--policy", "topology-aware", "--policy", "kubelet-static", *extra]
        return main(args), ""

    def test_json_output_has_one_object_per_policy_with_contract_fields(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, _ = self._run(tmp_path, "-o", "json")
        assert code == 0
        data = json.loads(capsys.readouterr().out)
        assert [d["policy"] for d in data] == ["topology-aware", "kubelet-static"]
        # kubelet-static has no exclusiveness levels: it rejects the level "core" request too.
        expected = {
            "topology-aware": (4, {"not_enough_cpus": 1}),
            "kubelet-static": (3, {"bad_level": 1, "not_enough_cpus": 1}),
        }
        for d in data:
            admitted, reasons = expected[d["policy"]]
            assert d["admitted"] == admitted
            assert d["rejected"] == sum(reasons.values())
            assert d["rejection_reasons"] == reasons
            for key in ("numa_aligned_ratio", "llc_aligned_ratio", "full_core_ratio"):
                assert 0.0 <= d[key] <= 1.0
            assert d["seconds"] >= 0 and d["events"] == 7

    def test_decisions_file_has_one_json_line_per_add_and_policy(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "decisions.jsonl"
        code, _ = self._run(tmp_path, "--decisions", str(path))
        assert code == 0
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert len(lines) == 2 * 5
        for line in lines:
            assert set(line) == {"policy", "event", "id", "cpus", "reason"}
            assert (line["cpus"] is None) != (line["reason"] is None)
        first = [line for line in lines if line["policy"] == "topology-aware"]
        assert [line["event"] for line in first] == [0, 1, 2, 3, 6]
        assert first[3]["cpus"] is None and first[3]["id"] == "ns/big/c"
        assert len(CPUSet.parse(first[0]["cpus"])) == 4
        table = capsys.readouterr().out
        assert "topology-aware" in table and "NUMA-ALIGNED" in table


class TestOutput:
    def test_progress_bar_draws_with_carriage_returns_and_ends_with_a_newline(self) -> None:
        import io

        from corepin.cli.simulate_cmd import _ProgressBar

        stream = io.StringIO()
        bar = _ProgressBar(stream, "topology-aware", width=10)
        bar(5, 10)
        bar(10, 10)
        text = stream.getvalue()
        assert text.count("\r") == 2
        assert "[#####-----]  50% 5/10 events" in text
        assert text.endswith("100% 10/10 events\n")

    def test_no_progress_bar_when_stderr_is_not_a_terminal(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        from corepin.cli import simulate_cmd

        topo = write_topology(tmp_path, two_l3_per_numa())
        out = tmp_path / "t.json"
        assert (
            main(
                [
                    "simulate",
                    "--generate",
                    "--topology",
                    topo,
                    "--events",
                    str(simulate_cmd.PROGRESS_MIN_EVENTS),
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        policy = "topology-aware"
        assert main(["simulate", "--topology", topo, "--trace", str(out), "--policy", policy]) == 0
        captured = capsys.readouterr()
        assert "\r" not in captured.err
        assert captured.out.splitlines()[0].split()[:3] == ["POLICY", "ADMITTED", "REJECTED"]


def test_simulate_runs_on_a_real_machine_sysfs_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = SYSFS_FIXTURES / "intel-2s-8c-ht-32cpu"
    if not root.is_dir():
        pytest.skip("real-machine sysfs fixtures are not present")
    trace = write_trace(
        tmp_path,
        [{"op": "add", "id": f"ns/p{i}/c", "cpus": 4} for i in range(9)],
    )
    args = ["simulate", "--sysfs-root", str(root), "--trace", trace]
    assert main([*args, "--policy", "topology-aware", "-o", "json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    # 32 CPUs: eight 4-CPU requests fit as two whole cores inside one socket each; the ninth not.
    assert (result["admitted"], result["rejected"]) == (8, 1)
    assert result["numa_aligned_ratio"] == 1.0
    assert result["full_core_ratio"] == 1.0


def test_replay_options_reach_every_exclusive_request_of_every_policy() -> None:
    from corepin.allocation.policies import get_policy

    events = [
        {"op": "add", "id": "odd", "cpus": 3},
        {"op": "add", "id": "even", "cpus": 4},
        {"op": "add", "id": "shared", "cpus": 1, "shared": True},
    ]
    trace = parse_trace({"events": events})
    for name in ("topology-aware", "kubelet-static"):
        result = replay(
            two_numa_smt(), trace, get_policy(name), options={"full-pcpus-only": "true"}
        )
        assert result.reasons == {"smt_alignment": 1}, name
        assert (result.admitted_exclusive, result.admitted_shared) == (1, 1)
        assert result.full_core_ratio == 1.0


@settings(max_examples=examples(25))
@given(
    seed=st.integers(0, 2**31),
    machine=st.sampled_from(["dual_socket_ht", "multi_numa_per_socket", "sixteen_numa"]),
    policy_name=st.sampled_from(["topology-aware", "kubelet-static", "workload-aware"]),
)
def test_replaying_generated_churn_keeps_live_exclusive_cpus_disjoint(
    seed: int, machine: str, policy_name: str
) -> None:
    from corepin.allocation.policies import get_policy
    from corepin.allocation.tracegen import ChurnOptions, generate_trace
    from corepin.testing.machines import named

    topo = named(machine)
    trace = parse_trace(generate_trace(topo, seed=seed, options=ChurnOptions(events=300)))
    records: list[DecisionRecord] = []
    result = replay(topo, trace, get_policy(policy_name), on_decision=records.append)
    assert result.admitted + result.rejected == trace.adds == len(records)
    by_event = {r.event: r for r in records}
    live: dict[str, CPUSet] = {}
    for index, event in enumerate(trace.events):
        if event.op == "remove":
            live.pop(event.id, None)
            continue
        record = by_event[index]
        assert (record.cpus is None) == (record.reason is not None)
        if record.cpus is None or event.shared:
            continue
        if event.workload == "best-effort":  # placed in the shared pool, withholds nothing
            assert record.cpus.isdisjoint(CPUSet().union(*live.values()))
            continue
        assert len(record.cpus) == event.cpus
        for other in live.values():
            assert record.cpus.isdisjoint(other)
        live[event.id] = record.cpus
