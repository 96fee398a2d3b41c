"""Fixtures shared by several test modules.

- `containerd`, `busybox_rootfs`: one private containerd and one busybox root filesystem for
  the whole session (see `containerd_harness.py`), shared by the container end-to-end tests;
  skipped with the reason when the host cannot run containers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from containerd_harness import (
    Containerd,
    DaemonDidNotStart,
    build_busybox_rootfs,
    private_containerd,
    skip_reason,
)


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        with private_containerd(tmp_path_factory.mktemp("containerd")) as daemon:
            yield daemon
    except DaemonDidNotStart as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return build_busybox_rootfs(tmp_path_factory.mktemp("rootfs"))
