"""The node QoS policy file (`--qos-config FILE`), shared by host mode, the node agent and the
NRI plugin: read it, and read it again when it changed.

`read_policy_file` refuses a file that cannot be read or holds a bad policy with an InputError
naming the file (and the field: `corepin.allocation.qos.parse_policy_text`). `PolicyFile`
remembers what the file looked like when it was last read (inode, size, modification time), so
a loop can ask each period whether an operator edited it.
"""

from __future__ import annotations

import os

from corepin.allocation.qos import QosPolicy, parse_policy_text
from corepin.core.errors import InputError

__all__ = ["PolicyFile", "read_policy_file"]


def read_policy_file(path: str) -> QosPolicy:
    """The policy in `path` (YAML or JSON); InputError naming the file (and the field)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise InputError(f"--qos-config {path}: no such file", reason="no_such_file") from None
    except OSError as err:
        raise InputError(
            f"--qos-config {path}: cannot read it: {err.strerror or err}", reason="unreadable_file"
        ) from None
    except UnicodeDecodeError:
        raise InputError(f"--qos-config {path}: not UTF-8 text", reason="bad_qos_policy") from None
    return parse_policy_text(text, path)


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class PolicyFile:
    """A policy file and what it looked like when last read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen = _stamp(path)

    def read(self) -> QosPolicy:
        """Read it now (and remember this version); InputError as `read_policy_file`."""
        self._seen = _stamp(self.path)
        return read_policy_file(self.path)

    def changed(self) -> bool:
        """Whether it was edited, replaced or removed since it was last read (or looked at):
        each change is reported once."""
        stamp = _stamp(self.path)
        if stamp == self._seen:
            return False
        self._seen = stamp
        return True
