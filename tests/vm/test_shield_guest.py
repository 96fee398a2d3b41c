"""The whole-machine shield in test-bed guests (QEMU, `tests/vm`), where the machine is ours:
every task, the unbound kernel threads and the IRQs, on cgroup v2 (the guests' hierarchy) and
on cgroup v1 where the guest's kernel offers it; and the noisy-neighbour benchmark there.

The work happens inside the guest (`tests/vm/shield_guest_check.py`, also runnable by hand in any
machine that is yours); this module boots the guest and reads the verdict. It skips when the
test bed is not there (`tests/vm` comes with the vmbed branch) or cannot run on this machine
(`vm.skip_reason()`), and never shields this host: on the host only scratch scopes are
shielded (test_shield_realhost.py).

To point it at guests: `pytest tests/vm/test_shield_guest.py` with the test bed merged; the shape
defaults to the first of `SHIELD_SHAPES` the bed knows (`COREPIN_SHIELD_SHAPE` picks one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from support.paths import REPO

vm = pytest.importorskip("vm", reason="the VM test bed (tests/vm, branch vmbed) is not here")

#: guest shapes to shield, best first (names of `vm.SHAPES`)
SHIELD_SHAPES = ("l3x2", "numa4-smt2", "numa4-nosmt")
REASON = vm.skip_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vm,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]


def _shape() -> Any:
    wanted = os.environ.get("COREPIN_SHIELD_SHAPE")
    names = [wanted] if wanted else [n for n in SHIELD_SHAPES if n in vm.SHAPES]
    if not names or names[0] not in vm.SHAPES:
        pytest.skip(f"no guest shape for the shield (asked for {names})")
    return vm.SHAPES[names[0]]


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # v1 controllers left free, so the v1 check can mount a cpuset hierarchy of its own
    with vm.Guest(_shape(), tmp_path_factory.mktemp("shield-guest"), cgroup_v1=True) as g:
        yield g


def _check(guest: Any, *args: str) -> dict[str, Any]:
    code, data = vm.guest_check(guest, "shield_guest_check.py", *args, timeout=900)
    if code == 3 and "skip" in data:
        pytest.skip(data["skip"])
    return dict(data)


def test_the_whole_machine_shield_on_cgroup_v2(guest: Any) -> None:
    data = _check(guest, "--state-dir", "/tmp/shield-v2")
    assert data["ok"], data["problems"]
    assert data["figures"]["on_seconds"] <= 30 and data["figures"]["off_seconds"] <= 30


def test_the_whole_machine_shield_on_cgroup_v1(guest: Any) -> None:
    data = _check(guest, "--state-dir", "/tmp/shield-v1", "--hierarchy", "v1")
    assert data["ok"], data["problems"]


@pytest.mark.skipif(
    os.environ.get("COREPIN_VM_BENCH", "") not in ("1", "on", "yes"),
    reason="the benchmark in a guest takes minutes under TCG: COREPIN_VM_BENCH=1 runs it",
)
def test_the_noisy_neighbour_benchmark_runs_in_the_guest(guest: Any) -> None:
    result = guest.run(
        [
            "python",
            str(REPO / "benchmarks" / "noisy_neighbour" / "shield.py"),
            "--whole-machine",
            "--this-machine-is-mine",
            "--rounds",
            "1",
            "--iterations",
            "4000",
        ],
        timeout=1800,
    )
    result.check()
    assert "shielded" in result.stdout
