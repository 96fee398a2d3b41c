"""The virtual-machine test bed: QEMU guests of chosen shapes running this checkout."""

from .checks import guest_check
from .guest import (
    Guest,
    GuestBootError,
    GuestCommandFailed,
    GuestDied,
    GuestError,
    GuestPool,
    GuestTimeout,
    Result,
    skip_reason,
)
from .shapes import SHAPES, Shape

__all__ = [
    "SHAPES",
    "Guest",
    "GuestBootError",
    "GuestCommandFailed",
    "GuestDied",
    "GuestError",
    "GuestPool",
    "GuestTimeout",
    "Result",
    "Shape",
    "guest_check",
    "skip_reason",
]
