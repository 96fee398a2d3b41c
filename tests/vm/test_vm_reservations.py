"""Reservations and rebalancing end to end on cgroup v2 (tests/vm/reservations_scenario.py, in
the numa4-smt2 guest): the real `corepin agent` (moving live, evicting for reservations) and
the real `corepin controller` against the fake API server, pods as real processes in the
kubelet's cgroup layout. What the kernel shows (cgroup files, each process's
Cpus_allowed_list) and what the API shows (CPUReservation phases, NodeCPUTopology, Events)
after each step."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vm import skip_reason as vm_skip_reason

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or ""),
]


def cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


@pytest.fixture(scope="module")
def scenario(vm_numa4_smt2: Any) -> dict[str, Any]:
    result = vm_numa4_smt2.run(
        "python tests/vm/reservations_scenario.py /tmp/reservations-e2e", timeout=900
    )
    lines = [x for x in result.stdout.splitlines() if x.startswith("{")]
    assert lines, result.output
    out: dict[str, Any] = json.loads(lines[-1])
    assert "error" not in out, (out.get("error"), out.get("agent_log_tail"))
    return out


def test_an_opted_out_container_is_never_moved(scenario: dict[str, Any]) -> None:
    assert scenario["opted_out"] == scenario["straddling"]
    assert scenario["opted_out_moved_events"] == []


def test_without_the_opt_out_it_is_moved_live_onto_one_numa_node(
    scenario: dict[str, Any],
) -> None:
    nodes = [set(n) for n in scenario["numa"]]
    new = set(scenario["moved"]["cpus"])
    assert len(new) == 2 and any(new <= n for n in nodes)
    node = next(i for i, n in enumerate(nodes) if new <= n)
    assert scenario["moved"]["mems"] == str(node)
    assert scenario["moved"]["events"]


def test_a_reservation_is_held_then_consumed_by_its_pod_and_deleted(
    scenario: dict[str, Any],
) -> None:
    assert scenario["db_available"]["held"] == scenario["db_available"]["cpus"]
    assert scenario["db_cpus"] == scenario["db_reserved"]
    assert scenario["db_consumed"] is True


def test_an_expired_reservation_gives_its_cpus_back(scenario: dict[str, Any]) -> None:
    held = cpus(scenario["short_available"]["cpus"])
    assert not cpus(scenario["shared_without"]) & held
    assert scenario["short_expired"] is True
    assert held <= cpus(scenario["shared_back"])
    assert scenario["short_dropped"] is True


def test_a_budget_refuses_the_eviction_until_it_is_gone(scenario: dict[str, Any]) -> None:
    assert scenario["refused"] and scenario["victim_kept"] == "victim"
    assert scenario["next_waiting"] == "Pending"
    assert scenario["evicted"] is True
    assert scenario["next_available"]["cpus"]


def test_the_agent_and_controller_stopped_cleanly(scenario: dict[str, Any]) -> None:
    assert scenario["agent_exit"] == 0 and scenario["controller_exit"] == 0
    assert scenario["agent_tracebacks"] == 0, scenario["agent_log_tail"]
    assert scenario["controller_tracebacks"] == 0, scenario["controller_log_tail"]
