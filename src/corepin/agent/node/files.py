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
never reads the CPUs of its predecessor.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Final

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
        entries = list(os.scandir(directory))
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


__all__ = ["KEEP", "MAX_PLAIN", "file_name", "file_uid", "remove_files", "sweep", "write_files"]
