"""What `corepin webhook` was started with: `WebhookConfig`, and the flags that need reading
(`--node-selector KEY=VALUE`, `--toleration KEY[=VALUE][:EFFECT]`, checked as label keys and
values; InputError naming the flag otherwise).
"""

from __future__ import annotations

import re
from typing import Final

from corepin.core.errors import InputError
from corepin.core.record import record

#: The agent's `--assignment-dir` on the host (deploy/agent mounts the same path).
DEFAULT_ASSIGNMENT_DIR: Final = "/run/corepin/assignments"
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


@record
class Toleration:
    """A toleration added to patched pods: `KEY[=VALUE][:EFFECT]` (no value: `Exists`)."""

    key: str
    value: str = ""
    effect: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"key": self.key, "operator": "Equal" if self.value else "Exists"}
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        return out


@record
class WebhookConfig:
    """What `corepin webhook` was started with (flags of the same names). An empty
    `assignment_dir_host` mounts nothing (only `COREPIN_NUM_CPUS` is set)."""

    scheduler_name: str = ""
    assignment_dir_host: str = DEFAULT_ASSIGNMENT_DIR
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    def __post_init__(self) -> None:
        if self.assignment_dir_host and not self.assignment_dir_host.startswith("/"):
            raise InputError(
                f"--assignment-dir-host {self.assignment_dir_host!r} must be an absolute path "
                "('' for no mount)",
                reason="bad_assignment_dir",
            )


def _label_key(key: str, flag: str, text: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or (
        slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))
    ):
        raise InputError(
            f"{flag} {text!r}: {key!r} is not a label key ([prefix/]name, the name 1-63 "
            "letters, digits, '-', '_' or '.')",
            reason="bad_flag",
        )
    return key


def _label_value(value: str, flag: str, text: str) -> str:
    if value and not _LABEL_NAME.match(value):
        raise InputError(
            f"{flag} {text!r}: {value!r} is not a label value (at most 63 letters, digits, '-', "
            "'_' or '.', beginning and ending with a letter or digit)",
            reason="bad_flag",
        )
    return value


def parse_node_selector(text: str) -> tuple[str, str]:
    """`--node-selector KEY=VALUE` -> (key, value); InputError naming the flag otherwise."""
    key, eq, value = text.partition("=")
    if not eq:
        raise InputError(f"--node-selector {text!r}: expected KEY=VALUE", reason="bad_flag")
    flag = "--node-selector"
    return _label_key(key, flag, text), _label_value(value, flag, text)


def parse_toleration(text: str) -> Toleration:
    """`--toleration KEY[=VALUE][:EFFECT]` (EFFECT one of NoSchedule, PreferNoSchedule,
    NoExecute; none: every effect) -> Toleration; InputError naming the flag otherwise."""
    flag = "--toleration"
    body, colon, effect = text.rpartition(":") if ":" in text else (text, "", "")
    if colon and effect not in TAINT_EFFECTS:
        raise InputError(
            f"{flag} {text!r}: the effect must be one of {', '.join(TAINT_EFFECTS)}",
            reason="bad_flag",
        )
    key, _, value = body.partition("=")
    return Toleration(_label_key(key, flag, text), _label_value(value, flag, text), effect)
