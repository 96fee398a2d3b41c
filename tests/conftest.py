"""Fixtures shared by several test modules.

- `containerd`, `busybox_rootfs`: one private containerd and one busybox root filesystem for
  the whole session (see `containerd_harness.py`), shared by the container end-to-end tests;
  skipped with the reason when the host cannot run containers.
- `vm_pool`: the QEMU guests of the session (`tests/vm`), one running at a time; `vm_<shape>`
  (`vm_numa4_smt2`, `vm_l3x2`, `vm_numa4_nosmt`, `vm_offline_isol`): a booted guest of that
  shape, booted once per session (again only if another shape ran in between); skipped with the
  reason where QEMU cannot run, failed with the console's tail where the guest does not boot.
- `fake_api`: a started fake Kubernetes API server (plain http, no auth; `corepin.testing.fakeapi`),
  stopped after the test; `fake_kubeconfig` a kubeconfig for it; `kube` a corepin KubeClient
  on it; `tls_material` a CA, server and client certificates for the https variants.
- `kubelet_harness`: a started `support.kubelet_harness.KubeletHarness` (a harness, not a test),
  the kubelet of one node (random name) of `fake_api`, running real containers in `containerd`
  below a scratch kubelet cgroup root; after the test it kills its containers and removes its
  cgroups, and fails the test when something was left behind or one of its workers raised.
- `cri_bed` (one per test module): a started `support.cri_harness.CriBed`, a private
  containerd 1.7 with the CRI and NRI on (the NRI plugin's end-to-end tests); `nri_socket` its
  NRI socket's path, where a plugin connects. Skipped with the reason where the bed cannot run
  (`cri_harness.skip_reason`); after the module every pod, process, mount and cgroup of it is
  removed, and the module fails when something could not be.
- Hypothesis: one profile for the session, chosen with `COREPIN_HYPOTHESIS_PROFILE`: `dev` (the
  default) runs every property test's own budget of examples (`support.budget.examples`),
  `ci` five times as many, `fast` a tenth; none has a deadline (the machines running the suite
  are shared, so a slow example says nothing) or fails a test for generating data slowly.
- At the end of the session, the cpuset groups that host mode made on this machine for the
  session's own state directories (`corepin/sd-*` that were not there when it began) are
  removed, after ending the processes still in them (a test's commands: a run killed with
  SIGKILL cannot release its group); the session fails when one cannot be removed.
  `COREPIN_TEST_SWEEP=off` turns the sweep off: for several test sessions run at once from
  different checkouts on one machine, where one session's sweep would end the others' runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.testing.fakeapi import FakeApiServer, TLSMaterial, make_tls
from support.containerd_harness import (
    Containerd,
    DaemonDidNotStart,
    build_busybox_rootfs,
    private_containerd,
    skip_reason,
)
from support.cri_harness import BedDidNotStart, CriBed, cri_testbed
from support.cri_harness import skip_reason as cri_skip_reason
from support.kubelet_harness import KubeletHarness
from vm import SHAPES, Guest, GuestBootError, GuestPool
from vm import skip_reason as vm_skip_reason


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


@pytest.fixture(scope="module")
def cri_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriBed]:
    reason = cri_skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        with cri_testbed(
            tmp_path_factory.mktemp("cri-bed"), tmp_path_factory.getbasetemp() / "cri-api"
        ) as bed:
            yield bed
    except BedDidNotStart as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def nri_socket(cri_bed: CriBed) -> str:
    return cri_bed.nri_socket


# ---------------------------------------------------------------------- Hypothesis
settings.register_profile(
    "dev", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", settings.get_profile("dev"), max_examples=500, print_blob=True)
settings.register_profile("fast", settings.get_profile("dev"), max_examples=10)
settings.load_profile(os.environ.get("COREPIN_HYPOTHESIS_PROFILE", "dev"))


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
    with FakeApiServer(bookmark_interval=0.5) as api:
        yield api


@pytest.fixture
def fake_kubeconfig(fake_api: FakeApiServer, tmp_path: Path) -> Path:
    return fake_api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube(fake_kubeconfig: Path) -> Iterator[KubeClient]:
    client = KubeClient.from_config(load_config(fake_kubeconfig, env={}), timeout=10)
    yield client
    client.close()


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TLSMaterial:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def kubelet_harness(
    containerd: Containerd,
    busybox_rootfs: Path,
    fake_api: FakeApiServer,
    fake_kubeconfig: Path,
    tmp_path: Path,
) -> Iterator[KubeletHarness]:
    kubelet = KubeletHarness(
        containerd, busybox_rootfs, fake_kubeconfig, workdir=tmp_path / "kubelet"
    )
    try:
        kubelet.start()
        yield kubelet
    finally:
        left = kubelet.stop()
    assert not left, f"the test kubelet left behind: {left}"
    assert not kubelet.errors, f"the test kubelet's workers failed: {kubelet.errors}"


# ---------------------------------------------------------------------- host cgroups
HOST_PARENT = Path("/sys/fs/cgroup/cpuset/corepin")
_BEFORE = pytest.StashKey[set[str] | None]()
_STARTED = pytest.StashKey[bool]()


def _state_groups() -> set[str]:
    try:
        return {e.name for e in HOST_PARENT.iterdir() if e.name.startswith("sd-")}
    except OSError:
        return set()


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("COREPIN_TEST_SWEEP") == "off":
        return
    session.config.stash[_BEFORE] = _state_groups() if HOST_PARENT.exists() else None
    session.config.stash[_STARTED] = True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not session.config.stash.get(_STARTED, False) or all(
        item.get_closest_marker("vm") for item in session.items
    ):
        return  # guest tests make no groups on this host (and another session may be running)
    before = session.config.stash[_BEFORE]
    left = [
        n for n in sorted(_state_groups() - (before or set())) if not _remove_tree(HOST_PARENT / n)
    ]
    if before is None and not left:  # the parent too, when this session made it
        with contextlib.suppress(OSError):
            HOST_PARENT.rmdir()
    if left:
        print(f"\nscratch cpuset groups that could not be removed: {left}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _remove_tree(group: Path) -> bool:
    """End the processes of `group` and below (this session's commands), then remove the
    groups, deepest first."""
    groups = sorted((d for d in group.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
    for d in [*groups, group]:
        for _ in range(50):
            try:
                pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return True
