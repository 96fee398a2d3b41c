"""The node QoS loop on cgroup v2 in a test-bed guest (QEMU, `tests/vm`): BE cpuset suppression
of the BE group and every group below it (a child with CPUs of its own is narrowed, one with
an empty cpuset.cpus keeps inheriting and its effective CPUs follow; the kernel confines the
busy loops), cpu.idle for BE, cfsQuota as cpu.max (and the cpusets put back), the burst clamped
to the quota with cpu.max.burst read back.

The work happens inside the guest (`tests/vm/qos_v2_guest_check.py`); this module boots one
guest, runs the check once and reads its verdicts. Skips where the test bed cannot run
(`vm.skip_reason()`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from support.paths import REPO

vm = pytest.importorskip("vm", reason="the VM test bed (tests/vm) is not here")

REASON = vm.skip_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vm,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]
SHAPE = "numa4-nosmt"


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if SHAPE not in vm.SHAPES:
        pytest.skip(f"no guest shape {SHAPE}")
    with vm.Guest(vm.SHAPES[SHAPE], tmp_path_factory.mktemp("qos-v2-guest")) as guest:
        result = guest.run(
            [
                "python",
                str(REPO / "tests" / "vm" / "qos_v2_guest_check.py"),
                "--this-machine-is-mine",
            ],
            timeout=600,
        )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, result.output
    data: dict[str, Any] = json.loads(lines[-1])
    yield data


@pytest.mark.parametrize(
    "name",
    ["cpuset", "children", "inherit", "idle", "cfsquota", "burst"],
)
def test_the_qos_loop_on_cgroup_v2(verdicts: dict[str, Any], name: str) -> None:
    assert verdicts["verdicts"][name], (verdicts["problems"], verdicts["figures"])


def test_the_guest_check_saw_no_problem(verdicts: dict[str, Any]) -> None:
    assert verdicts["ok"], verdicts["problems"]
