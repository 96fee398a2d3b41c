"""Enforcement: making cgroups, process affinities and resctrl classes match decisions.

Modules (imported on demand, so `import corepin.enforcement` stays cheap):

- `cgroups`:   `CgroupV1(cpuset_root, cpu_root)`, `CgroupV2(root)`, `CpuQuota`, `detect_mounts`,
               `open_cgroups`; reads/writes cpuset.cpus, cpuset.mems, CFS quota; kernel errnos
               mapped to `CgroupError` reasons.
- `layout`:    the kubelet's cgroupfs and systemd paths for pods and containers of containerd,
               CRI-O, docker; `find_container_cgroup` / `index_container_cgroups` by scanning.
- `affinity`:  `pin_process_tree` (sched_setaffinity for every thread of a process tree).
- `reconcile`: `Reconciler` / `reconcile` over `CgroupTarget` and `ProcessTarget`, with
               hierarchy ordering (widen parents first, shrink children first) and a report of
               every change; a steady state writes nothing.
- `resctrl`:   `ResctrlWriter` for L3 CAT and MBA classes (Intel percent, AMD absolute).
- `faketree`:  fake cgroup trees in a plain directory that refuse what the v1 kernel refuses.

Every path is built from ids validated by `corepin.core.ids`.
"""
