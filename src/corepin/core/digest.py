"""Digests of JSON values: one canonical serialization and its SHA-256.

The checkpoint's checksum (`corepin.state.checkpoint`) and the topology fingerprint a state
records (`corepin.state.model.fingerprint`) are both `sha256:<hex>` of the same canonical bytes:
`json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` as UTF-8, so two
values that are equal give equal digests whatever the order of their keys.
"""

from __future__ import annotations

import json

try:  # the builtin module is much cheaper to import than hashlib (OpenSSL)
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - Python >= 3.12 names it _sha2
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from hashlib import sha256 as _sha256


def canonical_bytes(value: object) -> bytes:
    """The one serialization every digest is computed over (see the module docstring)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def sha256_hex(data: bytes) -> str:
    """The hex SHA-256 of `data`."""
    return str(_sha256(data).hexdigest())


def canonical_digest(value: object) -> str:
    """`sha256:<hex>` of the canonical bytes of `value`."""
    return "sha256:" + sha256_hex(canonical_bytes(value))
