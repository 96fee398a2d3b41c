"""The shield on cgroup v2 layouts that real hosts have, in a test-bed guest (QEMU, `tests/vm`): a
scope whose own group holds tasks (alone, with groups below it holding tasks and a threaded
subtree, and as a thread root), and a leaf with tasks whose empty cpuset.cpus inherits its
parent's. Each layout: `shield on --scope` covers every thread (none may use the exclusive
run's CPU, `shield status` lists nothing exposed), and `shield off` puts back exactly what was
there (cpuset.cpus including absent and empty values, subtree_control, cgroup.type, every
thread's group).

The work happens inside the guest (`tests/vm/shield_v2_guest_check.py`); this module boots one
guest and reads the verdicts. Skips where the test bed cannot run (`vm.skip_reason()`).
"""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if SHAPE not in vm.SHAPES:
        pytest.skip(f"no guest shape {SHAPE}")
    with vm.Guest(vm.SHAPES[SHAPE], tmp_path_factory.mktemp("shield-v2-guest")) as g:
        yield g


def _check(guest: Any, layout: str) -> dict[str, Any]:
    data: dict[str, Any] = vm.guest_check(
        guest, "shield_v2_guest_check.py", "--state-dir", f"/tmp/shield-v2-{layout}", layout
    )[1]
    return data


@pytest.mark.parametrize("layout", ["flat", "internal", "inherit", "threadroot"])
def test_a_scoped_shield_on_cgroup_v2_covers_every_task_and_off_restores_the_layout(
    guest: Any, layout: str
) -> None:
    data = _check(guest, layout)
    assert data["ok"], data["problems"]
    assert data["figures"]["on_rc"] == 0 and data["figures"]["off_rc"] == 0


@pytest.mark.parametrize("layout", ["partition", "badpartition"])
def test_a_partition_below_the_scope_is_left_as_it_is_its_tasks_exposed_and_on_exits_4(
    guest: Any, layout: str
) -> None:
    """A partition on the exclusive run's CPU (valid below a partition-root scope, invalid
    below a member one): `on` does not narrow it, lists its tasks as exposed and exits 4;
    `off` puts every group back, the partition's state included."""
    data = _check(guest, layout)
    assert data["ok"], data["problems"]
    figures = data["figures"]
    assert figures["allowed_on_run_cpu"], "the layout put no task on the run's CPU"
    assert figures["on_rc"] == 4 and figures["off_rc"] == 0
    assert set(figures["allowed_on_run_cpu"]) <= set(figures["exposed"])
