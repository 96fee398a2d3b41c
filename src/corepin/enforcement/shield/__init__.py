"""The shield: keep the tasks corepin does not manage off the CPUs it hands out.

- `control`: `Shield`, the orchestration for host mode and the node agent (`corepin shield
  on|off|status`, the re-sizing every allocation change does): the system set, the managed
  processes, the mode;
- `engine`: `ShieldEngine`, the mechanism, composed of `tree` (the cpuset hierarchy and the proc
  tree as the shield sees them), `cpuset_mode` (raise and keep a cpuset shield),
  `cpuset_restore` (take it down), `affinity_mode` (confine task affinities where no cpuset
  controller is usable), `kthreads` and `irqs` (`--kthreads`, `--irqs`);
- `scope`: the pure rules (what is in scope, what "confined" means); `result`: `ShieldResult`.

Submodules are imported by name (this package imports nothing, so `corepin run` pays for the
shield only when one is up).
"""
