"""The node QoS loop on cgroup v2 in a test-bed guest (QEMU, `tests/vm`), with real busy loops and
the kernel's own answers (cgroup files read back, every thread's Cpus_allowed_list):

- the engine: BE cpuset suppression of the BE group and every group below it, cpu.idle,
  cfsQuota as cpu.max (the cpusets put back), the burst clamped to the quota;
- every layout of the BE group the kernel allows (a thread root holding tasks itself, a
  threaded subtree below a pod, inheriting pods, pods with CPUs outside the BE set, cpuset
  partitions elsewhere taking CPUs): BE threads only on the BE set, nothing outside the BE
  subtree written, `off` putting back what was there;
- host mode end to end with the real CLI (BE, LS and exclusive runs, `reconcile --once
  --qos-config` with cpuset, cfsQuota and beCPUIdle, `report`, clean-up);
- CPU burst with a throttled bursty load: cpuBurstOnly clamped and read back, auto raising
  the quota while throttled and lowering it back.

The work happens inside the guest (`tests/vm/qos_v2_guest_check.py`, one part per command);
this module boots one guest, runs each part once and reads its verdicts. Skips where the test
bed cannot run (`vm.skip_reason()`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

vm = pytest.importorskip("vm", reason="the VM test bed (tests/vm) is not here")

REASON = vm.skip_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vm,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]
SHAPE = "numa4-nosmt"
LAYOUTS = ("threadroot", "threadedpod", "inherit", "outside", "partition")
PARTS = ("engine", *LAYOUTS, "burst", "host")

#: (part, verdict, what it proves)
CASES = [
    (
        "engine",
        "cpuset",
        "the BE set keeps off reserved, exclusive and LSR CPUs, then shrinks to the budget the "
        "measured LS use leaves",
    ),
    ("engine", "children", "a BE pod with CPUs of its own is narrowed and its loop confined"),
    ("engine", "inherit", "an inheriting BE pod stays empty while its effective CPUs follow"),
    ("engine", "idle", "beCPUIdle sets the BE group's cpu.idle to 1 and back to 0"),
    (
        "engine",
        "cfsquota",
        "cfsQuota gives the budget as cpu.max, puts the cpusets back, and off lifts the quota",
    ),
    ("engine", "burst", "the kernel refuses a burst above the quota and corepin clamps to it"),
    *(
        (layout, verdict, f"{layout}: {sentence}")
        for layout in LAYOUTS
        for verdict, sentence in (
            ("confined", "after cpuset periods every BE thread may run only on the BE set"),
            ("outside untouched", "no group outside the BE subtree was written"),
            (
                "off restores",
                "off puts back what was there, empty values included where the kernel allows",
            ),
            ("no problem", "no period reported a problem"),
        )
    ),
    ("burst", "clamped", "cpuBurstOnly writes cpu.max.burst clamped to the quota, read back"),
    (
        "burst",
        "raised while throttled",
        "auto raises cpu.max step by step while nr_throttled grows",
    ),
    ("burst", "lowered when idle", "auto lowers cpu.max back to the base when the load stops"),
    ("burst", "no problem", "no burst period reported a problem or a refused write"),
    ("host", "the runs started", "two BE runs, an LS run and an exclusive run start"),
    ("host", "cpuset", "reconcile with cpuset keeps every BE thread on a smaller BE set"),
    ("host", "exclusive untouched", "no BE thread may use the exclusive run's CPU"),
    ("host", "LS keeps its CPUs", "the LS run keeps the CPUs it had"),
    ("host", "cfsquota", "reconcile with cfsQuota gives the BE group a cpu.max quota"),
    (
        "host",
        "cpuset put back",
        "cfsQuota in a later reconcile puts back the cpuset an earlier one narrowed",
    ),
    ("host", "idle", "beCPUIdle sets the BE group's cpu.idle to 1"),
    ("host", "report", "corepin report shows every run's QoS class"),
    ("host", "clean", "no allocation and no cgroup is left after the runs end"),
]


@pytest.fixture(scope="module")
def part(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], dict[str, Any]]]:
    """The verdicts of a part of the guest check (each part runs once, in one guest)."""
    if SHAPE not in vm.SHAPES:
        pytest.skip(f"no guest shape {SHAPE}")
    done: dict[str, dict[str, Any]] = {}
    with vm.Guest(vm.SHAPES[SHAPE], tmp_path_factory.mktemp("qos-v2-guest")) as guest:

        def run(name: str) -> dict[str, Any]:
            if name not in done:
                done[name] = vm.guest_check(guest, "qos_v2_guest_check.py", name)[1]
            return done[name]

        yield run


@pytest.mark.parametrize(
    ("name", "verdict"), [pytest.param(p, v, id=sentence) for p, v, sentence in CASES]
)
def test_the_qos_loop_on_cgroup_v2(
    part: Callable[[str], dict[str, Any]], name: str, verdict: str
) -> None:
    data = part(name)
    assert data["verdicts"][verdict], (data["problems"], data["figures"])


@pytest.mark.parametrize("name", PARTS)
def test_the_guest_check_saw_no_problem(part: Callable[[str], dict[str, Any]], name: str) -> None:
    data = part(name)
    assert data["ok"], data["problems"]
    assert set(data["verdicts"]) == {v for p, v, _ in CASES if p == name}
