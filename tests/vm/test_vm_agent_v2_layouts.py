"""`corepin agent` on cgroup v2 with the kubelet's pod groups laid out the other ways v2 allows
(tests/vm/agent_layouts_scenario.py, in the numa4-smt2 guest): a threaded subtree below an
exclusive container, a container group whose process sits in an inner child group, and a pod
group (inheriting) narrowed by someone to CPUs that leave its container's out."""

from __future__ import annotations

import json

import pytest

from vm import SHAPES, Guest
from vm import skip_reason as vm_skip_reason

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or ""),
]

SHAPE = SHAPES["numa4-smt2"]
ALL = set(range(SHAPE.cpus))


def cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def test_the_node_agent_pins_threaded_and_inner_layouts_below_pod_groups(
    vm_numa4_smt2: Guest,
) -> None:
    result = vm_numa4_smt2.run(
        "python tests/vm/agent_layouts_scenario.py /tmp/agent-layouts", timeout=600
    )
    [line] = [x for x in result.stdout.splitlines() if x.startswith("{")]
    out = json.loads(line)
    assert result.returncode == 0 and "error" not in out, out
    assert out["tracebacks"] == 0, out["agent_log_tail"]
    layout = out["layout"]
    # the container became the root of a threaded subtree; the init.scope child inherits
    assert layout["big"] == "domain threaded" and layout["worker"] == "threaded"
    assert layout["shared"] == "domain" and layout["scope_cpus"] == ""
    pinned = out["pinned"]
    big, small, shared = (cpus(pinned[k]) for k in ("big", "small", "shared"))
    assert len(big) == 4 and len(small) == 2 and shared == ALL - big - small
    # the worker thread's own cpuset (every CPU) yields to its container's
    assert cpus(pinned["worker_cpus"]) == ALL
    assert cpus(pinned["big_worker"]) == big == cpus(pinned["big_main"])
    assert cpus(pinned["shared_proc"]) == shared and "init.scope" in pinned["shared_in"]
    # narrowed pod group: the kernel moved small onto the pod group's CPU, the agent took it back
    assert out["pod_group_before"] == ""
    narrowed = out["narrowed"]
    assert cpus(narrowed["small"]) == small and not cpus(narrowed["effective"]) & small
    assert not cpus(narrowed["small_proc"]) & small
    assert cpus(out["repaired"]["small_proc"]) == small
    assert small <= cpus(out["repaired"]["pod_group"])
    assert cpus(out["after_delete"]["shared_proc"]) == ALL
    assert out["agent_exit"] == 0
