"""Host mode's best-effort group, the CPU accounting of runs and a run's resctrl group: the
parts of node QoS that `corepin run` needs (`corepin.agent.host.qos` has the loop).

A state directory's best-effort runs (`corepin run --qos-class BE`) live in one group,
`<cgroup parent>/besteffort/<run id>`; the QoS loop of `corepin reconcile` owns that group's
cpuset (or quota) and narrows it while latency-sensitive work needs the CPUs. What a BE run
gets is the BE group's current cpuset within the shared pool (`be_cpus`).

On cgroup v1 the cpu and cpuacct controllers are hierarchies of their own: a run's group is
made there too and its process joins them before CMD runs (`accounting_joins`), so a quota on
the BE group holds and the loop can read every run's CPU use. On cgroup v2 the BE group and
every group above it get `cpu` in `cgroup.subtree_control` where offered
(`offer_cpu_controller`).

A run joins its class's resctrl group (`resctrl_tasks_file`) before CMD execs, so every thread
it makes inherits the class.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Final

from corepin.agent.settings import DEFAULT_RESCTRL_ROOT
from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError
from corepin.core.qos import resctrl_group
from corepin.enforcement.cgroups import CgroupDriver, CgroupV1, CgroupV2, find_v1_controller

__all__ = [
    "DEFAULT_RESCTRL_ROOT",
    "accounting_joins",
    "be_cpus",
    "find_cpuacct_root",
    "make_be_group",
    "offer_cpu_controller",
    "resctrl_tasks_file",
]


def be_cpus(view: CgroupDriver | None, be_group: str, pool: CPUSet) -> CPUSet:
    """The CPUs best-effort runs get with shared pool `pool`: the BE group's cpuset within
    the pool; the pool when there is no BE group to read (`view` None, no group). When the pool
    lost every CPU of the group, as many of the pool's CPUs as the group had (its highest), so
    a change of the pool alone never widens BE work to the whole pool."""
    if view is None or not pool:
        return pool
    try:
        if not view.exists(be_group):
            return pool
        group = view.read_cpus(be_group)
    except CgroupError:
        return pool
    inside = group & pool
    if inside or not group:
        return inside or pool
    return CPUSet(pool.sorted()[-min(len(group), len(pool)) :])


def offer_cpu_controller(driver: CgroupDriver, groups: Iterable[str]) -> None:
    """cgroup v2: `cpu` in the subtree_control of `groups` (top down, from the hierarchy root:
    a group offers `cpu` to its children only when its parent enabled it) where the hierarchy
    offers it, so the BE group can be given a quota and cpu.idle; nothing on v1. A group that
    cannot (processes of its own) is left as it is, and the walk stops there: cpusets still
    work."""
    if not isinstance(driver, CgroupV2):
        return
    for group in groups:
        try:
            driver.enable_controllers(group, ("cpu",))
        except CgroupError:
            return


#: the BE group's CPU weight: the least the kernel takes (v1 `cpu.shares`, v2 `cpu.weight`), as
#: the kubelet gives its besteffort group, so BE runs get a CPU's time when others leave it
LOWEST_WEIGHT: Final = {1: ("cpu.shares", "2"), 2: ("cpu.weight", "1")}


def make_be_group(driver: CgroupDriver, be_group: str) -> int:
    """Create the BE group where it is missing, (v2) enable `cpu` from the hierarchy root down
    to it where offered (`offer_cpu_controller`), so the QoS loop can give it a quota and
    cpu.idle, and give it the lowest CPU weight (`LOWEST_WEIGHT`; read first, written only when
    it differs). The number of groups made."""
    made = 0 if driver.exists(be_group) else len(driver.create(be_group))
    parts = be_group.split("/")
    offer_cpu_controller(driver, ["/".join(parts[:n]) for n in range(len(parts) + 1)])
    name, value = LOWEST_WEIGHT[driver.version]
    root = driver.cpu_root if isinstance(driver, CgroupV1) else driver.root
    if root is not None and os.path.exists(os.path.join(driver.dir(be_group, root), name)):
        with contextlib.suppress(CgroupError):
            if driver.read_file(be_group, name, root) != value:
                driver.write_file(be_group, name, value, root)
    return made


def find_cpuacct_root(driver: CgroupDriver, cgroup_root: str) -> str | None:
    """cgroup v1: the cpuacct hierarchy (`find_v1_controller`) when it is a mount of its own
    (not co-mounted with cpuset or cpu, whose groups the driver already makes); None
    otherwise, on v2 and in a tree standing in for cgroupfs."""
    if not isinstance(driver, CgroupV1) or driver.fake_tree:
        return None
    found = find_v1_controller("cpuacct", cgroup_root)
    if found is None:
        return None
    known = {os.path.realpath(r) for r in (driver.root, driver.cpu_root) if r is not None}
    return None if os.path.realpath(found) in known else found


def accounting_joins(driver: CgroupDriver, path: str, cpuacct_root: str | None) -> tuple[str, ...]:
    """cgroup v1: the `tasks` files of group `path` in the cpu hierarchy (the driver made the
    group there) and in the cpuacct one (made here), for a new run's process to join; nothing
    on v2 (one tree) or in a tree standing in for cgroupfs."""
    if not isinstance(driver, CgroupV1) or driver.fake_tree:
        return ()
    out: list[str] = []
    cpu_root = driver.cpu_root
    if cpu_root is not None and cpu_root != driver.root:
        folder = driver.dir(path, cpu_root)
        if os.path.isdir(folder):
            out.append(os.path.join(folder, "tasks"))
    if cpuacct_root is not None:
        folder = driver.dir(path, cpuacct_root)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as err:
            raise CgroupError(folder, f"cannot create the group: {err.strerror or err}") from err
        out.append(os.path.join(folder, "tasks"))
    return tuple(out)


def resctrl_tasks_file(root: str, qos_class: str) -> str | None:
    """The `tasks` file of `qos_class`'s resctrl group under `root` when it has one (its
    policy differs from the whole machine and the QoS loop made the group)."""
    path = os.path.join(root, resctrl_group(qos_class), "tasks")
    return path if os.path.isfile(path) else None
