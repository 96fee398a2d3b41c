"""Pinning what already runs: a process (`corepin pin --pid`, the node API's Allocate in host
mode) or a container found in the kubelet's cgroup layout by its id.

A running process is pinned by affinity, its whole tree, as `corepin run` pins CMD (no cgroup:
a running process is not moved; its memory policy stays its own); a container through its
cpuset cgroup.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from corepin.agent.host.agent import HostAgent
from corepin.agent.host.run import RunSpec
from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem, InputError
from corepin.core.ids import validate_container_id
from corepin.core.text import printable
from corepin.enforcement.layout import KUBEPODS, find_container_cgroup
from corepin.enforcement.shield.control import process_owners
from corepin.state.model import Assignment
from corepin.state.owners import ContainerOwner, ProcessOwner
from corepin.sysfs.procfs import ProcessGone, ProcessGroup, read_stat


def pin_container(
    host: HostAgent,
    container_id: str,
    *,
    exclusive: int | None,
    runtime: str | None = None,
    options: Mapping[str, str] | None = None,
    kubepods: str = KUBEPODS,
) -> Assignment:
    """Find a running container's cgroup in the kubelet layouts (below `kubepods`), allocate
    for it and write its cpuset: exclusive CPUs, or the shared pool when `exclusive` is None.

    The id is validated before any path is built (IdError, exit 2); a container without a
    cgroup raises InputError; a host without a writable cpuset hierarchy EnvironmentProblem.
    """
    ident = validate_container_id(container_id, runtime or "generic")
    driver = host.pinner.driver
    if driver is None:
        raise EnvironmentProblem(
            "pinning a container needs a writable cpuset cgroup hierarchy (run as root with "
            f"cgroup v1 cpuset mounted under {host.settings.cgroup_root}; cgroups mode is "
            f"{host.settings.cgroups!r})",
            reason="no_cpuset_hierarchy",
        )
    path = find_container_cgroup(driver.root, ident, runtime=runtime, under=(kubepods,))
    if path is None:
        raise InputError(
            f"no cgroup for container {ident!r} below {driver.root}/{kubepods}: is it running?",
            reason="container_not_found",
        )
    spec = RunSpec(exclusive=exclusive, options=options)
    request = spec.request()
    kind = spec.kind(request)
    with host.transaction() as txn:
        state, _ = host.liveness.reap(txn.state)
        decision = host.decide(state, request, kind)
        assignment = Assignment(
            id=f"ctr-{ident[:12]}",
            kind=kind,
            cpus=decision.cpus if kind != "shared" else CPUSet(),
            withheld=decision.withheld if kind != "shared" else CPUSet(),
            mems=decision.mems if kind != "shared" else CPUSet(),
            level=request.level,
            owner=ContainerOwner(container_id=ident, runtime=runtime or "", cgroup=path),
            created=time.time(),
            policy=decision.policy,
            workload=request.workload,
        )
        state = txn.commit(state.replace_assignment(assignment))
        if assignment.exclusive:
            host.repin_shared(state)
        host.pinner.apply(assignment, state.shared_pool)
    return assignment


def pin_process(
    host: HostAgent,
    pid: int,
    spec: RunSpec,
    *,
    kind: str | None = None,
    name: str | None = None,
) -> Assignment:
    """Allocate for a process that already runs and pin its whole tree by affinity.

    `kind` defaults to what `spec` asks (`RunSpec.kind`); `share` is accepted too; with
    `spec.cpus`, exactly those CPUs. The process must exist (InputError `no_such_process`),
    be a user process (InputError `kernel_thread`) and not belong to an allocation yet
    (InputError `already_pinned`: its own, or as a process of another run). Its processes
    are freed when they are gone (pid and start time). With a cpuset shield up, processes
    of it that sit in a group not allowing their new CPUs move to the shield's managed
    group first."""
    request = spec.request()
    kind = kind or spec.kind(request)
    if kind != "shared" and request.workload == "best-effort":
        kind = "shared"
    try:
        st = read_stat(pid, host.settings.proc_root)
    except ProcessGone:
        raise InputError(f"no process {pid}", reason="no_such_process") from None
    if st.kernel_thread or pid == 2:
        raise InputError(
            f"process {pid} ({printable(st.comm)}) is a kernel thread: corepin pins user "
            "processes (`corepin shield on --kthreads` confines kernel threads)",
            reason="kernel_thread",
        )
    if not st.alive:
        raise InputError(f"process {pid} has exited (a zombie)", reason="no_such_process")
    start = st.start_time
    comm, command = _process_labels(pid, host.settings.proc_root)
    with host.transaction() as txn:
        state, _ = host.liveness.reap(txn.state)
        state = host.with_reserved(state)
        table = host.liveness.table()
        for held in state:
            if held.pid == pid:
                raise InputError(
                    f"process {pid} already holds allocation {held.id}",
                    reason="already_pinned",
                )
        owner = process_owners(state, table, cgroup_pids=host.pinner.cgroup_pids).get(pid)
        if owner is not None:
            raise InputError(
                f"process {pid} already belongs to allocation {owner} (a process of that "
                "run): release it first",
                reason="already_pinned",
            )
        if spec.cpus is not None:
            decision = host.decide_cpus(state, spec.cpus, kind)
        else:
            decision = host.decide(state, request, kind)
        while True:
            assignment_id = f"pid-{pid}-{os.urandom(2).hex()}"
            if assignment_id not in state:
                break
        owned = kind != "shared"
        assignment = Assignment(
            id=assignment_id,
            kind=kind,
            cpus=decision.cpus if owned or spec.exclusive else CPUSet(),
            withheld=decision.withheld if owned else CPUSet(),
            mems=decision.mems if owned else CPUSet(),
            level=request.level,
            owner=ProcessOwner(
                pid=pid, start_time=start, name=name or comm, command=command[:1024]
            ),
            created=time.time(),
            policy=decision.policy,
            workload=request.workload,
        )
        state = state.add(assignment)
        if state.shield is not None:
            tree = ProcessGroup(pid, start).pids(table)
            record = host.shield.make_room(state, tree, assignment.affinity(state.shared_pool))
            if record is not None:
                state = state.evolve(shield=record)
        state = txn.commit(host.sync_shield(state, strict=assignment.exclusive))
        failed = [c for c in host.enforce(state, {assignment.id}) if c.action == "failed"]
        if failed:  # not ours to pin (permission), or gone meanwhile: undo the record
            txn.commit(host.sync_shield(state.remove(assignment.id)))
            raise EnvironmentProblem(
                f"cannot pin process {pid}: {failed[0].detail}", reason="pin_failed"
            )
        if assignment.exclusive:
            host.repin_shared(state)
    return assignment


def _process_labels(pid: int, proc_root: str) -> tuple[str, str]:
    """(command name, command line) of a process for reports ("" when unreadable)."""
    comm = command = ""
    try:
        with open(
            os.path.join(proc_root, str(pid), "comm"), encoding="utf-8", errors="replace"
        ) as f:
            comm = f.read().strip()
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        pass
    return comm, command
