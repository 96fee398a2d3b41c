"""The node QoS policy a host's state directory keeps.

`--qos-config FILE` (`corepin run`, `corepin reconcile`) is parsed before anything is touched (a
bad file is refused naming the file and the field: exit 2, the old policy stays) and kept beside
the checkpoint as `qos-policy.json` (written atomically, under the state lock), so later commands
without `--qos-config` use the last one given (`stored_policy`). None ever given: the default.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Final

from corepin.allocation.qos import QosPolicy, parse_policy, parse_policy_text
from corepin.core.errors import InputError, StateFormatError
from corepin.state.checkpoint import os_error

__all__ = ["POLICY_FILE", "read_policy_file", "store_policy", "stored_policy"]

#: The file beside the checkpoint that keeps the last policy given.
POLICY_FILE: Final = "qos-policy.json"


def read_policy_file(path: str) -> QosPolicy:
    """The policy in `path` (YAML or JSON); InputError naming the file (and the field)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise InputError(f"--qos-config {path!r} does not exist", reason="no_such_file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"cannot read --qos-config {path!r}: {exc}", reason="unreadable_file"
        ) from None
    return parse_policy_text(text, path)


def stored_policy(state_dir: str) -> QosPolicy | None:
    """The policy kept in `state_dir` (None when none was ever given); StateFormatError naming
    the file when it is not one."""
    path = os.path.join(state_dir, POLICY_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StateFormatError(f"{path}: cannot read the kept QoS policy: {exc}") from None
    try:
        return parse_policy(json.loads(text))
    except (ValueError, InputError) as exc:
        raise StateFormatError(
            f"{path}: not a QoS policy ({exc}); give one with --qos-config FILE, or remove it"
        ) from None


def store_policy(state_dir: str, policy: QosPolicy) -> bool:
    """Keep `policy` in `state_dir` (atomically: a temporary file renamed over the old one);
    False when the same policy is kept already (nothing written). Call under the state lock."""
    if stored_policy(state_dir) == policy:
        return False
    path = os.path.join(state_dir, POLICY_FILE)
    data = (json.dumps(policy.to_json(), indent=2, sort_keys=True) + "\n").encode()
    tmp = os.path.join(state_dir, f".{POLICY_FILE}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise os_error(path, exc, "write the QoS policy") from None
    return True
