"""The node agent's assignment files: one file per container in the assignment directory
(`--assignment-dir`, mounted read-only into pods at /etc/corepin by the webhook).

File name: `<namespace>.<pod>.<container>`. Namespaces and container names are DNS labels (no
dots) and pod names DNS subdomains, so the name is unambiguous. A name longer than
`MAX_PLAIN` = 255 characters (the most a file name may have; a pod name alone may have 253),
or one holding anything but lowercase letters, digits, `-` and `.`, is written as its first
`KEEP` = 200 characters, `_`, and the first 40 hex digits of the SHA-256 of the whole name:
stable across restarts, and never equal to a plain name (those have no `_`).

Content (ASCII, `KEY=VALUE` lines, as `corepin run` gives a command): COREPIN_CPUS,
COREPIN_CPUS_EXCLUSIVE, COREPIN_CPUS_SHARED, COREPIN_MEMS, COREPIN_POLICY, COREPIN_POD_UID.
Files are replaced atomically (written under a hidden temporary name, then renamed), removed
when their container or pod is gone - only when they still name that pod's uid, so a pod
created again under the same name never loses its new file - and a sweep (at start-up and on
every resync) removes every file that belongs to no live pod: a StatefulSet pod created again
never reads the CPUs of its predecessor. `AssignmentFiles` keeps the files of the node's pods
as the state says.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Final

from corepin.agent.node.sync import pod_assignments, shared_pool_users
from corepin.agent.node.watches import Watches
from corepin.core.cpuset import CPUSet
from corepin.kube.models import ObjectView
from corepin.kube.podplan import PodPlan, plan_pod
from corepin.state.model import HostState
from corepin.topology.model import Topology

log = logging.getLogger("corepin.agent.node")

#: longest name written as it is
MAX_PLAIN: Final = 255
#: characters of the name kept in front of its hash
KEEP: Final = 200
_PLAIN: Final = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_UID_LINE: Final = "COREPIN_POD_UID="


def file_name(namespace: str, pod: str, container: str) -> str:
    """The assignment file name of a container (see the module docstring)."""
    name = f"{namespace}.{pod}.{container}"
    if len(name) <= MAX_PLAIN and _PLAIN.match(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    keep = re.sub(r"[^a-z0-9.-]", "-", name[:KEEP])
    return f"{keep}_{digest}"


def _tmp_name(name: str) -> str:
    return f".{hashlib.sha256(name.encode()).hexdigest()[:32]}.tmp"


def file_uid(path: str) -> str | None:
    """The pod uid an assignment file names (None: unreadable or none)."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(_UID_LINE):
            return line[len(_UID_LINE) :]
    return None


def write_files(directory: str, wanted: Mapping[str, str]) -> list[tuple[str, OSError]]:
    """Write every file of `wanted` (name -> text) that differs, each on its own: one that
    cannot be written is returned with its error, the others are written all the same."""
    failed: list[tuple[str, OSError]] = []
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for name, text in wanted.items():
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="ascii") as handle:
                if handle.read() == text:
                    continue
        except OSError:
            pass
        tmp = os.path.join(directory, _tmp_name(name))
        try:
            with open(tmp, "w", encoding="ascii") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            failed.append((name, exc))
    return failed


def remove_files(directory: str, names: Iterable[str], uid: str) -> None:
    """Remove the files `names` that still name pod `uid` (a pod of the same name created
    since owns them now)."""
    for name in names:
        path = os.path.join(directory, name)
        if file_uid(path) in (uid, None):
            with contextlib.suppress(OSError):
                os.unlink(path)


def sweep(directory: str, keep: Mapping[str, str]) -> list[str]:
    """Remove every file of the directory that is not in `keep` (name -> uid of a live pod)
    or names another uid there; returns the names removed."""
    removed: list[str] = []
    try:
        with os.scandir(directory) as found:
            entries = list(found)
    except OSError:
        return removed
    for entry in entries:
        if not entry.is_file(follow_symlinks=False) and not entry.is_symlink():
            continue
        uid = keep.get(entry.name)
        if uid is not None and file_uid(entry.path) in (uid, None):
            continue
        try:
            os.unlink(entry.path)
            removed.append(entry.name)
        except OSError as exc:
            log.warning("event=assignment_file_not_removed file=%s error=%s", entry.path, exc)
    return removed


class AssignmentFiles:
    """The assignment files of the node's pods in `directory` ("" writes none)."""

    def __init__(self, directory: str, topology: Topology, watches: Watches) -> None:
        self.directory = directory
        self.machine = topology
        self.watches = watches
        self._files: dict[str, set[str]] = {}  # pod uid -> assignment files we wrote

    def wanted(self, plan: PodPlan, state: HostState) -> dict[str, str]:
        """name -> text of the pod's assignment files: what each container got, in the form
        `corepin run` gives a command."""
        pool = state.shared_pool
        wanted: dict[str, str] = {}
        for a in pod_assignments(state, plan.uid):
            owner = a.container
            if owner is None or plan.container(owner.container) is None:
                continue
            own = a.cpus if a.holds else CPUSet()
            shared = pool if a.with_shared else CPUSet()
            mems = a.mems if a.holds and a.mems else self.machine.mems_of(own | shared)
            exclusive = own if a.exclusive else CPUSet()
            wanted[file_name(plan.namespace, plan.name, owner.container)] = (
                f"COREPIN_CPUS={own | shared}\nCOREPIN_CPUS_EXCLUSIVE={exclusive}\n"
                f"COREPIN_CPUS_SHARED={shared}\nCOREPIN_MEMS={mems}\n"
                f"COREPIN_POLICY={a.kind}\nCOREPIN_POD_UID={plan.uid}\n"
            )
        return wanted

    def write(self, plan: PodPlan, state: HostState) -> None:
        """Write the pod's files (each on its own: one that fails is logged, the others are
        written), and remove those of its containers that have none any more."""
        directory = self.directory
        if not directory:
            return
        wanted = self.wanted(plan, state)
        for name, exc in write_files(directory, wanted):
            log.warning("event=assignment_file_failed pod=%s file=%s error=%s", plan.key, name, exc)
        before = self._files.get(plan.uid, set())
        remove_files(directory, before - set(wanted), plan.uid)
        if wanted:
            self._files[plan.uid] = set(wanted)
        else:
            self._files.pop(plan.uid, None)

    def refresh_shared(self, state: HostState) -> None:
        """Rewrite the files of every pod with a container on the shared pool (it changed);
        one pod's failure does not stop the others'."""
        uids = {a.container.pod_uid for a in shared_pool_users(state) if a.container is not None}
        for pod in self.watches.pod_list():
            view = ObjectView(pod)
            if view.metadata.get("uid") in uids:  # the raw uid, as ever
                try:
                    self.write(plan_pod(pod), state)
                except Exception:
                    log.exception(
                        "event=assignment_files_crashed pod=%s/%s",
                        view.namespace or "default",
                        view.name,
                    )

    def remove(self, uid: str) -> None:
        """Remove the files of a pod that is gone."""
        names = self._files.pop(uid, set())
        if self.directory:
            remove_files(self.directory, names, uid)

    def sweep(self, state: HostState) -> None:
        """Remove every assignment file that belongs to no live pod (a previous run's, a pod
        deleted while the agent was down): at start-up and on every resync."""
        directory = self.directory
        if not directory:
            return
        keep: dict[str, str] = {}
        for pod in self.watches.pod_list():
            plan = plan_pod(pod)
            for name in self.wanted(plan, state):
                keep[name] = plan.uid
        removed = sweep(directory, keep)
        if removed:
            log.info("event=assignment_files_swept count=%d", len(removed))
        live = self.watches.live_uids()
        for uid in [u for u in self._files if u not in live]:
            self._files.pop(uid, None)


__all__ = [
    "KEEP",
    "MAX_PLAIN",
    "AssignmentFiles",
    "file_name",
    "file_uid",
    "remove_files",
    "sweep",
    "write_files",
]
