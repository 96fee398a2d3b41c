"""Safe text for terminals and line-oriented output.

Names, commands, cgroup paths and ids come from users and from the machine; printed as they are,
a newline forges a report row and an escape sequence repaints the terminal. `printable` escapes
every control character (C0, DEL, C1) and the Unicode line and paragraph separators the way
Python writes them in string literals (`\\n`, `\\x1b`, `\\u2028`). Backslashes stay as they are
(systemd unit names in cgroup paths use `\\x2d`). JSON and YAML output escape on their own.

`utc_text` is how a time is written for people and for JSON/YAML output: RFC 3339 in UTC.
"""

from __future__ import annotations

import time
from typing import Final

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _needs_escape(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code < 0xA0 or code in (0x2028, 0x2029)


def printable(text: object) -> str:
    """`text` (made a str) with control characters escaped."""
    value = text if isinstance(text, str) else str(text)
    if not any(_needs_escape(ch) for ch in value):
        return value
    return "".join(_escape(ch) if _needs_escape(ch) else ch for ch in value)


def utc_text(seconds: float | None) -> str | None:
    """Wall-clock `seconds` (since the epoch) as RFC 3339 UTC text, `2026-01-02T03:04:05Z`
    (whole seconds; None stays None)."""
    if seconds is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
