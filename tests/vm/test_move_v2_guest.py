"""Live moves of a running workload on cgroup v2 in a test-bed guest with four NUMA nodes
(QEMU, `tests/vm`): the reconciler rewrites a container group's CPUs and memory nodes in
place, in every layout a container may have in a v2 hierarchy (CPUs of its own, inheriting
from its pod, a threaded subtree, next to a cpuset partition), and the kernel's own answers
say what happened: every thread's Cpus_allowed_list sampled during the move, the pages of
the workload's memory per node from /proc/PID/numa_maps.

The work happens inside the guest (`tests/vm/move_v2_guest_check.py`, one layout per command);
this module runs each layout once in the session's numa4-nosmt guest and reads its verdicts.
Skips where the test bed cannot run (`vm.skip_reason()`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

vm = pytest.importorskip("vm", reason="the VM test bed (tests/vm) is not here")

REASON = vm.skip_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vm,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]
LAYOUTS = ("plain", "inherit", "threaded", "partition")
SENTENCES = {
    "moved": "afterwards every thread may run only on the new node's CPUs",
    "never empty": "no sample during the move saw a thread without a CPU",
    "never elsewhere": "no sample saw a thread allowed outside its old and new CPUs",
    "pages followed": "at least 90 % of the workload's memory is on the new node afterwards",
    "untouched": "a sibling cpuset partition keeps its CPUs and state",
    "clean": "no scratch group is left",
}


@pytest.fixture(scope="module")
def moved(vm_numa4_nosmt: Any) -> Callable[[str], dict[str, Any]]:
    """The verdicts of one layout (each runs once)."""
    done: dict[str, dict[str, Any]] = {}

    def run(layout: str) -> dict[str, Any]:
        if layout not in done:
            done[layout] = vm.guest_check(
                vm_numa4_nosmt, "move_v2_guest_check.py", layout, timeout=300
            )[1]
        return done[layout]

    return run


@pytest.mark.parametrize(
    ("layout", "verdict"),
    [
        pytest.param(layout, verdict, id=f"{layout}: {sentence}")
        for layout in LAYOUTS
        for verdict, sentence in SENTENCES.items()
    ],
)
def test_a_live_move_on_cgroup_v2(
    moved: Callable[[str], dict[str, Any]], layout: str, verdict: str
) -> None:
    data = moved(layout)
    assert data["verdicts"][verdict], (data["problems"], data["figures"])
