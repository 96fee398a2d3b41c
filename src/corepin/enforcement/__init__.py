"""Enforcement: making cgroups, process affinities and resctrl classes match decisions.

Modules (imported on demand, so `import corepin.enforcement` stays cheap):

- `cgroups`:   `CgroupV1(cpuset_root, cpu_root)`, `CgroupV2(root)`, `CpuQuota`, `detect_mounts`,
               `open_cgroups`, `open_cpuset_hierarchy`; reads/writes cpuset.cpus, cpuset.mems,
               CFS quota; kernel errnos mapped to `CgroupError` reasons.
- `layout`:    the kubelet's cgroupfs and systemd paths for pods and containers of containerd,
               CRI-O, docker (and its parent groups' names, `KUBELET_PARENTS`);
               `find_container_cgroup` / `index_container_cgroups` by scanning.
- `affinity`:  the one thread-affinity seam (`ThreadAffinity`, `pin_threads`) and
               `pin_process_group` / `pin_process_tree` (every thread of a process group).
- `reconcile`: `Reconciler` / `reconcile` over `CgroupTarget` and `ProcessTarget`, with
               hierarchy ordering (widen parents first, shrink children first) and a report of
               every change; a steady state writes nothing.
- `wanted`:    `cpus_and_mems`, what an assignment's cpuset should hold (host mode and node).
- `note`:      `Note` (what enforcement reports to people) and `Change` (one write).
- `shield/`:   keeping the tasks corepin does not manage off the CPUs it hands out.
- `mempolicy`: `set_mempolicy(2)` for a command's memory placement.
- `resctrl`:   `ResctrlWriter` for L3 CAT and MBA classes (Intel percent, AMD absolute).
- `faketree`:  fake cgroup trees in a plain directory that refuse what the v1 kernel refuses.

Every path is built from ids validated by `corepin.core.ids`.
"""
