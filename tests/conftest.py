"""Fixtures shared by several test modules.

- `containerd`, `busybox_rootfs`: one private containerd and one busybox root filesystem for
  the whole session (see `containerd_harness.py`), shared by the container end-to-end tests;
  skipped with the reason when the host cannot run containers.
- `vm_pool`: the QEMU guests of the session (`tests/vm`), one running at a time; `vm_<shape>`
  (`vm_numa4_smt2`, `vm_l3x2`, `vm_numa4_nosmt`, `vm_offline_isol`): a booted guest of that
  shape, booted once per session (again only if another shape ran in between); skipped with the
  reason where QEMU cannot run, failed with the console's tail where the guest does not boot.
- `fake_api`: a started fake Kubernetes API server (plain http, no auth; `fakeapi` package),
  stopped after the test; `fake_kubeconfig` a kubeconfig for it; `kube` a corepin KubeClient
  on it; `tls_material` a CA, server and client certificates for the https variants.
- `test_kubelet`: a started `test_kubelet.TestKubelet`, the kubelet of one node (random name)
  of `fake_api`, running real containers in `containerd` below a scratch kubelet cgroup root;
  after the test it kills its containers and removes its cgroups, and fails the test when
  something was left behind or one of its workers raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from containerd_harness import (
    Containerd,
    DaemonDidNotStart,
    build_busybox_rootfs,
    private_containerd,
    skip_reason,
)
from vm import SHAPES, Guest, GuestBootError, GuestPool
from vm import skip_reason as vm_skip_reason

if TYPE_CHECKING:
    from corepin.kube.client import KubeClient
    from fakeapi import FakeApiServer, TLSMaterial
    from test_kubelet import TestKubelet


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


# ---------------------------------------------------------------- virtual machines (tests/vm)
@pytest.fixture(scope="session")
def vm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestPool]:
    """The session's QEMU guests, one running at a time (skipped where QEMU cannot run)."""
    reason = vm_skip_reason()
    if reason:
        pytest.skip(reason)
    pool = GuestPool(tmp_path_factory.mktemp("vm"))
    try:
        yield pool
    finally:
        pool.close()
        for name, seconds in pool.boots:
            print(f"\nvm: booted {name} in {seconds:.1f}s")


def _guest(name: str) -> Callable[[GuestPool], Guest]:
    def fixture(vm_pool: GuestPool) -> Guest:
        try:
            return vm_pool.get(name)
        except GuestBootError as exc:
            pytest.fail(f"the {name} guest did not boot (twice): {exc}", pytrace=False)

    fixture.__name__ = "vm_" + name.replace("-", "_")
    fixture.__doc__ = f"A booted guest of shape {SHAPES[name].describe()}."
    return pytest.fixture(scope="session", name=fixture.__name__)(fixture)


vm_numa4_smt2 = _guest("numa4-smt2")
vm_l3x2 = _guest("l3x2")
vm_numa4_nosmt = _guest("numa4-nosmt")
vm_offline_isol = _guest("offline-isol")


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    from fakeapi import FakeApiServer

    with FakeApiServer(bookmark_interval=0.5) as api:
        yield api


@pytest.fixture
def fake_kubeconfig(fake_api: FakeApiServer, tmp_path: Path) -> Path:
    return fake_api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube(fake_kubeconfig: Path) -> Iterator[KubeClient]:
    from corepin.kube.client import KubeClient
    from corepin.kube.config import load_config

    client = KubeClient.from_config(load_config(fake_kubeconfig, env={}), timeout=10)
    yield client
    client.close()


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    from fakeapi import make_tls

    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(name="test_kubelet")
def _test_kubelet(
    containerd: Containerd,
    busybox_rootfs: Path,
    fake_api: FakeApiServer,
    fake_kubeconfig: Path,
    tmp_path: Path,
) -> Iterator[TestKubelet]:
    from test_kubelet import TestKubelet

    kubelet = TestKubelet(containerd, busybox_rootfs, fake_kubeconfig, workdir=tmp_path / "kubelet")
    try:
        kubelet.start()
        yield kubelet
    finally:
        left = kubelet.stop()
    assert not left, f"the test kubelet left behind: {left}"
    assert not kubelet.errors, f"the test kubelet's workers failed: {kubelet.errors}"
