"""Migration of a node from the kubelet's static CPU manager to corepin (`corepin migrate`).

Composition only: the state layer parses, verifies and converts the kubelet's
`cpu_manager_state` (`corepin.state.kubelet`) and keeps corepin's checkpoint; this module finds
the imported containers' cgroups and wires them together.

`migrate_from_kubelet(settings, topology, path)`:
  1. read and verify the kubelet checkpoint (a checksum mismatch is an InputError naming the
     file and both checksums: the kubelet itself would refuse that file);
  2. convert it for the live topology: every container entry becomes an exclusive assignment
     (`pod/<podUID>/<container>`, v1 files `container/<containerID>`), the default CPU set
     becomes the shared pool and the CPUs in neither become reserved (strict reservation);
     a checkpoint of the `none` policy holds no pinning and imports as an empty state;
  3. find each container's cgroup when a cpuset hierarchy is there (v2 entries: the child of the
     pod's cgroup whose cpuset.cpus equals the entry's CPUs, which is what the kubelet wrote;
     v1 entries: the container id's directory). An assignment with a cgroup stays alive while
     that cgroup exists; one without is freed by the next `corepin run` or `reconcile`, as the
     kubelet drops the state of containers that are gone;
  4. validate the result against the topology (`corepin.state.validate`);
  5. under the state lock, refuse when corepin's state already holds allocations (unless
     `force`: the imported state then replaces it), else commit. A dry run reads the state
     without the lock and writes nothing, not even the state directory.

A corrupt corepin checkpoint is never overwritten by an import: `quarantine` (an explicit
operator action) renames it aside first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from corepin.agent.host.pinning import usable_hierarchy
from corepin.core.cpuset import CPUSet
from corepin.core.errors import (
    CorepinError,
    InputError,
    StateError,
    StateFormatError,
)
from corepin.core.ids import QOS_CLASSES
from corepin.core.record import replace
from corepin.enforcement.cgroups import open_cpuset_hierarchy
from corepin.enforcement.layout import (
    KUBELET_PARENTS,
    Layout,
    find_container_cgroup,
    pod_cgroup_path,
)
from corepin.state.kubelet import convert, read_for_import
from corepin.state.store import StateStore
from corepin.state.validate import validate

if TYPE_CHECKING:
    from corepin.agent.host.settings import HostSettings
    from corepin.enforcement.cgroups import CgroupDriver
    from corepin.state.kubelet import KubeletCheckpoint
    from corepin.state.model import Assignment, HostState
    from corepin.topology.model import Topology


@dataclass(frozen=True, slots=True)
class MigrationResult:
    """What an import did (or, for a dry run, would do)."""

    checkpoint: KubeletCheckpoint
    state: HostState
    state_dir: str
    notes: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    dry_run: bool = False
    written: bool = False

    def to_json(self) -> dict[str, Any]:
        cp = self.checkpoint
        st = self.state
        return {
            "source": cp.source,
            "format": cp.format,
            "policy": cp.policy_name,
            "checksum": cp.checksum,
            "verified": cp.verified,
            "state_dir": self.state_dir,
            "dry_run": self.dry_run,
            "written": self.written,
            "revision": st.revision if self.written else None,
            "assignments": [
                {
                    "id": a.id,
                    "cpus": str(a.cpus),
                    "mems": str(a.mems),
                    "cgroup": a.cgroup,
                    "owner": a.owner.to_json() if a.owner is not None else None,
                }
                for a in st
            ],
            "shared_pool": str(st.shared_pool),
            "reserved": str(st.reserved),
            "free": str(st.free),
            "online": str(st.online),
            "options": dict(st.options),
            "replaced": list(self.replaced),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------- cgroups


def open_cgroup_driver(settings: HostSettings) -> CgroupDriver | None:
    """A read-only view of the cpuset hierarchy host mode would use (none when cgroups are off
    or there is no cpuset hierarchy, v1 or v2; with cgroups `on`, its absence is an error).
    Unlike the pinner it never creates corepin's own cgroup: looking up is all migrate does."""
    if settings.cgroups == "off":
        return None
    try:
        driver = usable_hierarchy(open_cpuset_hierarchy(settings.cgroup_root))
    except CorepinError:
        if settings.cgroups == "on":
            raise
        return None
    return driver


def _pod_cgroups(driver: CgroupDriver, pod_uid: str) -> list[str]:
    found = []
    for layout in Layout:
        for qos in QOS_CLASSES:
            path = pod_cgroup_path(layout, qos, pod_uid)
            if driver.exists(path):
                found.append(path)
    return found


def find_cgroup(driver: CgroupDriver, a: Assignment) -> str | None:
    """The cgroup of the container an imported assignment belongs to, or None."""
    owner = a.container
    if owner is None:
        return None
    try:
        if owner.container_id:
            return find_container_cgroup(driver.root, owner.container_id, under=KUBELET_PARENTS)
        if not owner.container:
            return None  # pod-level CPUs: no single container cgroup holds them
        matches = []
        for pod in _pod_cgroups(driver, owner.pod_uid):
            for child in driver.child_groups(pod):
                try:
                    if CPUSet.parse(driver.read_cpus_text(child)) == a.cpus:
                        matches.append(child)
                except (CorepinError, ValueError):
                    continue
        return matches[0] if len(matches) == 1 else None
    except CorepinError:  # an id that is not a pod uid / container id has no cgroup path
        return None


def attach_cgroups(state: HostState, driver: CgroupDriver | None) -> tuple[HostState, list[str]]:
    """`state` with each assignment's container cgroup filled in where one is found."""
    if driver is None:
        if not state.assignments:
            return state, []
        return state, [
            "event=no_cgroup_lookup cause=cgroups_off_or_no_cpuset_hierarchy (no running "
            "container found: the next `corepin run` or `reconcile` frees the imported ones)"
        ]
    notes: list[str] = []
    items = {}
    for a in state:
        path = find_cgroup(driver, a)
        if path is None:
            notes.append(
                f"event=no_container id={a.id} cause=no_cgroup_with_cpus_{a.cpus} (not running "
                "here: the next `corepin run` or `reconcile` frees it)"
            )
            items[a.id] = a
        else:
            notes.append(f"event=container_found id={a.id} cgroup={path}")
            owner = a.container
            assert owner is not None  # find_cgroup finds cgroups of containers only
            items[a.id] = a.evolve(owner=replace(owner, cgroup=path))
    return state.evolve(assignments=items), notes


# ---------------------------------------------------------------------- the import


def _corrupt_hint(exc: StateFormatError, state_dir: str) -> StateFormatError:
    return StateFormatError(
        f"{exc.message}; corepin never overwrites a corrupt checkpoint: move it aside with "
        f"`corepin migrate --quarantine --state-dir {state_dir}`, then import again",
        reason=exc.reason,
    )


def _not_empty(state_dir: str, existing: HostState) -> StateError:
    ids = list(existing.assignments)
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return StateError(
        f"{state_dir}: corepin's state already holds {len(ids)} allocation(s) ({shown}); "
        "corepin changed nothing. Import into an empty state: end those workloads and run "
        "`corepin reconcile --once` to free them, or pass --force to replace the whole state "
        "with the kubelet's (the listed allocations are dropped from it)",
        reason="state_not_empty",
    )


def migrate_from_kubelet(
    settings: HostSettings,
    topology: Topology,
    kubelet_path: str,
    *,
    dry_run: bool = False,
    force: bool = False,
) -> MigrationResult:
    """Import the kubelet checkpoint at `kubelet_path` into the state directory of `settings`."""
    checkpoint = read_for_import(kubelet_path)
    state, notes = convert(checkpoint, topology, created=time.time())
    state, found = attach_cgroups(state, open_cgroup_driver(settings))
    notes.extend(found)
    state, repairs = validate(state, topology)
    notes.extend(repairs)
    store = StateStore(settings.state_dir)

    def check(existing: HostState | None) -> list[str]:
        if existing is None or not existing.assignments:
            return []
        if not force:
            raise _not_empty(settings.state_dir, existing)
        dropped = list(existing.assignments)
        notes.extend(f"event=replaced id={i} cause=force" for i in dropped)
        return dropped

    if dry_run:
        try:
            replaced = check(store.read())
        except StateFormatError as exc:
            raise _corrupt_hint(exc, settings.state_dir) from None
        return MigrationResult(checkpoint, state, settings.state_dir, notes, replaced, True)
    try:
        with store.transaction() as tx:
            replaced = check(tx.state if tx.existed else None)
            written = tx.commit(state)
    except StateFormatError as exc:  # the only one the transaction raises: a bad checkpoint
        raise _corrupt_hint(exc, settings.state_dir) from None
    return MigrationResult(checkpoint, written, settings.state_dir, notes, replaced, False, True)


@dataclass(frozen=True, slots=True)
class QuarantineResult:
    state_dir: str
    moved_to: str | None
    problem: str

    def to_json(self) -> dict[str, Any]:
        return {"state_dir": self.state_dir, "moved_to": self.moved_to, "problem": self.problem}


def quarantine(settings: HostSettings, *, force: bool = False) -> QuarantineResult:
    """Rename a corrupt corepin checkpoint aside. A checkpoint that reads fine is left alone
    (InputError) unless `force`: it holds live allocations."""
    store = StateStore(settings.state_dir)
    problem = ""
    try:
        state = store.read()
    except StateFormatError as exc:
        problem = exc.message
    else:
        if state is None:
            return QuarantineResult(settings.state_dir, None, "")
        if not force:
            raise InputError(
                f"{store.path}: the checkpoint is not corrupt (revision {state.revision}, "
                f"{len(state.assignments)} allocation(s)); quarantine is for checkpoints corepin "
                "cannot read. Pass --force to move it aside anyway (its allocations are then "
                "forgotten)",
                reason="checkpoint_not_corrupt",
            )
    return QuarantineResult(settings.state_dir, store.quarantine(), problem)
