"""The versioned, checksummed checkpoint file: its bytes, encoded and decoded.

File format (UTF-8 JSON, one object, trailing newline):

    {"version":4,"checksum":"sha256:<64 hex>","payload":<payload>}

- `payload` is serialized canonically, exactly as
  `json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` encoded
  as UTF-8 (`corepin.core.digest.canonical_bytes`), and those bytes are embedded verbatim in
  the file; what it holds is described in `corepin.state.payload`;
- `checksum` is `sha256:` + the hex SHA-256 of those canonical payload bytes. A reader parses
  the file, re-serializes `payload` canonically and compares: any edit, bit flip or truncation
  is detected (a hand-reformatted file still verifies as long as the values are unchanged);
- `version` is the payload format version. Older versions are migrated in memory by the chain
  of functions in `corepin.state.migrations` (vN -> vN+1); a newer version than this code knows
  is refused.

A corrupt checkpoint raises `StateFormatError` naming the file and the problem. Reading and
writing the file itself (atomically, never through a link) is `corepin.state.files`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from corepin.core.digest import canonical_bytes, canonical_digest, sha256_hex
from corepin.core.errors import StateFormatError
from corepin.state.migrations import migrate
from corepin.state.model import HostState
from corepin.state.payload import (
    CURRENT_VERSION,
    PayloadReader,
    describe,
    payload_to_state,
    state_to_payload,
)


def encode_checkpoint(state: HostState) -> bytes:
    """The full file content for `state` (current version)."""
    body = canonical_bytes(state_to_payload(state))
    head = f'{{"version":{CURRENT_VERSION},"checksum":"sha256:{sha256_hex(body)}","payload":'
    return head.encode("ascii") + body + b"}\n"


def decode_checkpoint(data: bytes, source: str) -> HostState:
    """Parse, verify and migrate checkpoint bytes. StateFormatError names `source`."""
    if not data:
        raise StateFormatError(f"{source}: file is empty (0 bytes)", reason="truncated")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFormatError(
            f"{source}: not UTF-8 text (bad byte at offset {exc.start})", reason="bad_json"
        ) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()):
            raise StateFormatError(
                f"{source}: truncated: the JSON ends early at byte {len(data)} ({exc.msg})",
                reason="truncated",
            ) from None
        raise StateFormatError(
            f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            reason="bad_json",
        ) from None
    except RecursionError:
        raise StateFormatError(f"{source}: JSON nested too deeply", reason="bad_json") from None
    r = PayloadReader(source)
    top = r.obj(doc, "top level")
    for key in ("version", "payload", "checksum"):
        if key not in top:
            raise r.fail("top level", f"missing field {key!r}", "missing_field")
    version = top["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise r.fail("version", f"expected a positive integer, got {describe(version)}")
    if version > CURRENT_VERSION:
        raise StateFormatError(
            f"{source}: state format version {version} is newer than this corepin understands "
            f"(1..{CURRENT_VERSION}); upgrade corepin, or move the file away to start from an "
            "empty state",
            reason="unknown_version",
        )
    checksum = top["checksum"]
    if not isinstance(checksum, str) or not checksum.startswith("sha256:"):
        raise r.fail("checksum", f'expected "sha256:<hex>", got {describe(checksum)}')
    payload = r.obj(top["payload"], "payload")
    actual = canonical_digest(payload)
    if actual != checksum:
        raise StateFormatError(
            f"{source}: checksum mismatch: the file says {checksum} but its payload hashes to "
            f"{actual}; the checkpoint is corrupt (kept as is: inspect it, then restore it or "
            "quarantine it)",
            reason="checksum_mismatch",
        )
    return payload_to_state(migrate(version, dict(payload), source), source)


def encode_legacy(payload: Mapping[str, Any], version: int) -> bytes:
    """A checkpoint file of an older `version` around a payload of that version (tests, tools)."""
    body = canonical_bytes(payload)
    head = f'{{"version":{version},"checksum":"sha256:{sha256_hex(body)}","payload":'
    return head.encode("ascii") + body + b"}\n"
