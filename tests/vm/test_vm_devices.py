"""CPUs near a device on real kernels: QEMU guests whose NIC sits behind a PCI expander bridge
on one NUMA node (`pxb` with `numa_node=`), so the guest kernel reports the NIC's `numa_node`
and `local_cpulist` itself. `corepin topology` must find it where the kernel says it is, and
`corepin run --exclusive 2 --near <ifname>` must land on that node's CPUs and memory (read from
/proc: Cpus_allowed_list and numa_maps), for a 2- and a 4-node guest. Skips where the test bed
cannot run (`vm.skip_reason()`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from corepin.core.cpuset import CPUSet

vm = pytest.importorskip("vm", reason="the VM test bed (tests/vm) is not here")

REASON = vm.skip_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vm,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

#: the run's view of itself: its CPUs and the memory policy of its heap and stack
SHOW = (
    "grep Cpus_allowed_list: /proc/self/status; "
    "grep -E ' (heap|stack)( |$)' /proc/$$/numa_maps | cut -d' ' -f2 | sort -u"
)


@pytest.fixture(scope="module", params=["numa2-nic", "numa4-nic"])
def guest(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    shape = vm.SHAPES[request.param]
    with vm.Guest(shape, tmp_path_factory.mktemp(request.param)) as g:
        yield g


def corepin(guest: Any, *args: str) -> Any:
    return guest.run(["python", "-m", "corepin", *args], timeout=300)


def test_the_nic_is_found_on_the_node_the_kernel_puts_it(guest: Any) -> None:
    shape = guest.shape
    node = shape.pci_nodes[0]
    done = corepin(guest, "topology", "-o", "json")
    assert done.returncode == 0, done.output
    devices = {d["address"]: d for d in json.loads(done.stdout)["devices"]}
    nic = devices.get(shape.nic_address(0))
    assert nic is not None, sorted(devices)
    assert nic["kind"] == "nic" and nic["numa"] == node
    assert CPUSet.parse(nic["local_cpus"]) == CPUSet(shape.cpus_of_node(node))
    assert "eth0" in nic["names"], nic
    table = corepin(guest, "topology")
    assert table.returncode == 0 and shape.nic_address(0) in table.stdout, table.output


@pytest.mark.parametrize("near", ["eth0", "address"])
def test_run_near_the_nic_gets_its_nodes_cpus_and_memory(guest: Any, near: str) -> None:
    shape = guest.shape
    node = shape.pci_nodes[0]
    device = shape.nic_address(0) if near == "address" else near
    done = corepin(
        guest,
        "run",
        "--state-dir",
        f"/tmp/near-{near}",
        "--cgroups",
        "off",
        "--exclusive",
        "2",
        "--near",
        device,
        "--",
        "sh",
        "-c",
        SHOW,
    )
    assert done.returncode == 0, done.output
    lines = done.stdout.splitlines()
    cpus = CPUSet.parse(lines[0].split(":", 1)[1].strip())
    assert len(cpus) == 2 and cpus <= CPUSet(shape.cpus_of_node(node)), done.output
    policies = set(lines[1:])
    assert policies == {f"bind:{node}"}, done.output


def test_a_device_the_guest_does_not_have_is_exit_2_naming_it(guest: Any) -> None:
    done = corepin(
        guest,
        "run",
        "--state-dir",
        "/tmp/near-none",
        "--cgroups",
        "off",
        "--exclusive",
        "1",
        "--near",
        "eth7",
        "--",
        "true",
    )
    assert done.returncode == 2 and "eth7" in done.stderr, done.output
