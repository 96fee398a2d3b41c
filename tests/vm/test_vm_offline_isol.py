"""A real kernel with a core offline (CPUs 6-7) and `isolcpus=2,3`: topology discovery shows
both, and host mode never hands out an offline CPU, keeps isolated CPUs out of the shared pool
and gives them to exclusive runs only when asked or when nothing else is left."""

from __future__ import annotations

import pytest

from vm import SHAPES, Guest
from vm import skip_reason as vm_skip_reason
from vm.checks import cpus, lines, probe_self, topology, topology_mismatches

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or ""),
]

SHAPE = SHAPES["offline-isol"]


def test_corepin_topology_shows_the_offline_and_isolated_cpus(vm_offline_isol: Guest) -> None:
    data = topology(vm_offline_isol)
    assert topology_mismatches(SHAPE, data) == []
    assert vm_offline_isol.run("cat /sys/devices/system/cpu/offline").stdout == "6-7\n"


def test_runs_never_get_offline_cpus_and_isolated_ones_only_when_asked_or_needed(
    vm_offline_isol: Guest,
) -> None:
    result = vm_offline_isol.run(
        "\n".join(
            [
                "export COREPIN_STATE_DIR=/tmp/st COREPIN_CGROUPS=on; mkdir -m 700 /tmp/st",
                f"corepin run --shared -- {probe_self()}",
                f"corepin run --exclusive 4 -- {probe_self()}",
                f"corepin run --exclusive 2 --option prefer-isolated=true -- {probe_self()}",
                f"corepin run --exclusive 6 -- {probe_self()}",
                "corepin run --exclusive 7 -- true; echo exit=$?",
            ]
        )
    )
    shared, exclusive, isolated, everything = lines(result.stdout)
    # the shared pool: online CPUs that are not isolated
    assert cpus(shared["cpus"]) == {0, 1, 4, 5}
    # an exclusive run takes the ordinary CPUs first, the isolated ones when it prefers them
    assert cpus(exclusive["cpus"]) == {0, 1, 4, 5}
    assert cpus(isolated["cpus"]) == {2, 3}
    # all six online CPUs can be had, never the offline ones, and a seventh cannot
    assert cpus(everything["cpus"]) == {0, 1, 2, 3, 4, 5}
    assert "exit=3" in result.stdout
