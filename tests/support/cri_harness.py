"""A private containerd 1.7 with the CRI and NRI on: the test bed of the NRI plugin's end-to-end
tests (one daemon per test module: fixture `cri_bed` of `tests/conftest.py`).

Debian 12's containerd (1.6) has no NRI, so the bed runs Debian 13's containerd 1.7, fetched
and unpacked by `scripts/fetch-containerd-nri.sh` (called by `scripts/install-deps.sh --test`)
into `$COREPIN_TESTBED`, by default `~/.cache/corepin/testbed`; nothing of it is installed on
the system. `skip_reason()` says why the bed cannot run here (not root, no cgroup v1 cpuset
hierarchy, bed not fetched, runc or a static busybox missing).

`CriBed.start()` runs the daemon with everything below its base directory: root, state, the
gRPC and ttrpc sockets, runc's state, the NRI socket (`nri_socket`, where an NRI plugin
connects) with empty plugin directories (no plugin of the host is started), the containers'
logs. The CRI runs pods in the host's network (no CNI), on cgroupfs, below a cgroup of its own
(`cgroup_root`, `/corepin-nri-<random>`, in every v1 hierarchy); its one image is built from
the host's busybox (`cri_images`) and imported, no registry is asked. `cri` is a `CriClient`
(`cri_client`) on it; `restart()` stops the daemon and starts it again on the same state
(running containers live on in their shims).

`close()` removes everything, whatever happened: every pod through the CRI, the daemon, the
shims and the shim sockets of this daemon (found by its address: never another process), the
mounts below the base directory, the cgroups below `cgroup_root`, the base directory;
`leftovers()` lists what is still there (empty after `close()`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.containerd_harness import CGROUP, CPUSET, remove_cgroup_trees, static_busybox
from support.cri_client import CriClient, CriError, load_cri_api
from support.cri_images import IMAGE, busybox_image_tar
from support.helpers import allowed_cpus

#: where scripts/fetch-containerd-nri.sh unpacks the bed
TESTBED = Path(os.environ.get("COREPIN_TESTBED") or Path.home() / ".cache/corepin/testbed")
BED = TESTBED / "containerd-1.7"
BIN = BED / "usr/bin"
STAMP = BED / ".complete"
CRI_PROTO = BED / "usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"
#: the CRI's containerd namespace
NAMESPACE = "k8s.io"
#: where containerd 1.7's shims put their sockets, whatever the daemon's state directory
SHIM_SOCKETS = Path("/run/containerd/s")


def runc() -> str | None:
    return shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin")


@functools.cache
def skip_reason() -> str | None:
    """Why the CRI test bed cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root to run containers"
    if not (CPUSET / "cpuset.cpus").exists() or not os.access(CPUSET, os.W_OK):
        return f"needs a writable cgroup v1 cpuset hierarchy at {CPUSET}"
    if not STAMP.exists():
        return (
            f"the NRI test bed (containerd 1.7) is not fetched into {BED}: "
            "sh scripts/fetch-containerd-nri.sh (or scripts/install-deps.sh --test)"
        )
    if runc() is None:
        return "runc is not installed (apt-get install runc)"
    if static_busybox() is None:
        return "a static busybox is not installed (apt-get install busybox-static)"
    if importlib.util.find_spec("grpc_tools") is None:
        return "grpcio-tools is not installed (make dev)"
    return None


#: marks of a test module that runs the bed: real host, skipped with `skip_reason()`
NEEDS_CRI_BED = [
    pytest.mark.realhost,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]


class BedDidNotStart(RuntimeError):
    """The private containerd exited or was not ready in time (the message says which)."""


def _q(path: object) -> str:
    """A TOML string (JSON's quoting is TOML's for these paths)."""
    return json.dumps(str(path))


class CriBed:
    """One private containerd 1.7 with the CRI and NRI, below `base` (see the module's doc)."""

    def __init__(
        self,
        base: Path,
        api_dir: Path,
        *,
        nri_request_timeout: str = "2s",
        nri_registration_timeout: str = "5s",
    ) -> None:
        self.base = base
        self.address = str(base / "containerd.sock")
        self.nri_socket = str(base / "nri" / "nri.sock")
        #: NRI's directories of plugins started with the daemon, and of their configurations
        self.nri_plugin_dir = base / "nri" / "plugins"
        self.nri_config_dir = base / "nri" / "conf.d"
        self.cgroup_root = f"/corepin-nri-{secrets.token_hex(4)}"
        self.log = base / "containerd.log"
        self.image = IMAGE
        self.timings: dict[str, float] = {}
        self._nri_timeouts = (nri_request_timeout, nri_registration_timeout)
        self._api = load_cri_api(CRI_PROTO, api_dir)
        self._process: subprocess.Popen[bytes] | None = None
        self._shim_sockets: set[Path] = set()
        self.cri = CriClient(
            self.address,
            self._api,
            image=self.image,
            log_root=base / "pods",
            cgroup_root=self.cgroup_root,
        )

    # ------------------------------------------------------------------ the daemon
    def config(self) -> str:
        """The daemon's configuration (everything below `base`)."""
        b = self.base
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        request, registration = self._nri_timeouts
        return "\n".join(
            [
                "version = 2",
                f"root = {_q(b / 'root')}",
                f"state = {_q(b / 'state')}",
                f"[grpc]\n  address = {_q(self.address)}",
                f"[ttrpc]\n  address = {_q(self.address + '.ttrpc')}",
                '[plugins."io.containerd.internal.v1.opt"]',
                f"  path = {_q(b / 'opt')}",
                '[plugins."io.containerd.nri.v1.nri"]',
                "  disable = false",
                "  disable_connections = false",
                f"  socket_path = {_q(self.nri_socket)}",
                f"  plugin_path = {_q(self.nri_plugin_dir)}",
                f"  plugin_config_path = {_q(self.nri_config_dir)}",
                f"  plugin_request_timeout = {_q(request)}",
                f"  plugin_registration_timeout = {_q(registration)}",
                f"{cri}]",
                f"  sandbox_image = {_q(self.image)}",
                # without CAP_SYS_RESOURCE (a sandboxed CI) runc cannot lower oom_score_adj
                "  restrict_oom_score_adj = true",
                "  enable_cdi = false",
                "  disable_apparmor = true",
                "  enable_selinux = false",
                f"{cri}.cni]",
                f"  bin_dir = {_q(b / 'cni/bin')}",
                f"  conf_dir = {_q(b / 'cni/conf')}",
                f"{cri}.containerd]",
                '  default_runtime_name = "runc"',
                f"{cri}.containerd.runtimes.runc]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"{cri}.containerd.runtimes.runc.options]",
                "  SystemdCgroup = false",
                f"  BinaryName = {_q(runc())}",
                f"  Root = {_q(b / 'runc')}",
                "",
            ]
        )

    def start(self, timeout: float = 30) -> None:
        """Start the daemon (again, after `stop_daemon`, on the same state) and wait until its
        CRI is ready and the NRI socket is there; BedDidNotStart with its log's end if not."""
        began = time.monotonic()
        for d in ("pods", "nri/plugins", "nri/conf.d", "cni/bin", "cni/conf"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        config = self.base / "config.toml"
        config.write_text(self.config())
        # a socket file the last daemon left would pass for the new one's
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.nri_socket)
        # the daemon starts its shims by name: the 1.7 package's first on PATH
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        with open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                [str(BIN / "containerd"), "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # a ^C of the test run reaches pytest, not the daemon
            )
        self.cri.reconnect()
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise BedDidNotStart(f"containerd 1.7 exited: {self.log_tail()}")
            with contextlib.suppress(CriError):
                if self.cri.runtime_ready() and os.path.exists(self.nri_socket):
                    break
            if time.monotonic() > deadline:
                raise BedDidNotStart(
                    f"containerd 1.7 not ready in {timeout:g} s: {self.log_tail()}"
                )
            time.sleep(0.05)
        self.timings.setdefault("daemon start", time.monotonic() - began)

    def import_image(self, scratch: Path) -> None:
        """Build the busybox image and import it for the CRI (waits until the CRI sees it)."""
        busybox = static_busybox()
        assert busybox is not None, "no static busybox"
        tar = busybox_image_tar(Path(busybox), scratch / "busybox-image.tar")
        done = self.ctr("images", "import", str(tar))
        tar.unlink()
        if done.returncode != 0:
            raise BedDidNotStart(f"ctr images import failed: {done.stderr.strip()[-400:]}")
        deadline = time.monotonic() + 10
        while not self.cri.image_present(self.image):
            if time.monotonic() > deadline:
                raise BedDidNotStart(f"the CRI does not see the imported image {self.image}")
            time.sleep(0.05)

    def ctr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`ctr ARGS` (the 1.7 package's) on this daemon, in the CRI's namespace."""
        return subprocess.run(
            [str(BIN / "ctr"), "--address", self.address, "-n", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop_daemon(self, timeout: float = 20) -> None:
        """Stop the daemon (SIGTERM, SIGKILL after `timeout`); containers and shims live on."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def kill_daemon(self) -> None:
        """SIGKILL the daemon (a crash: shims, containers, mounts and cgroups stay)."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()

    def restart(self) -> None:
        """Stop the daemon and start it again with the same configuration and state."""
        self.stop_daemon()
        self.start()

    def log_tail(self, chars: int = 600) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:].replace("\n", " | ")
        return "(no log)"

    # ------------------------------------------------------------------ live state of a container
    def container_pid(self, cid: str) -> int:
        """The host pid of the container's first process."""
        return int(self.cri.container_info(cid)["pid"])

    def container_cgroup(self, cid: str) -> str:
        """The container's cpuset cgroup, relative to the hierarchy (from its process)."""
        for line in Path(f"/proc/{self.container_pid(cid)}/cgroup").read_text().splitlines():
            _n, controllers, path = line.split(":", 2)
            if "cpuset" in controllers.split(","):
                return path.lstrip("/")
        raise AssertionError(f"container {cid[:12]} has no cpuset cgroup")

    def live_cpuset(self, cid: str) -> str:
        """The container cgroup's `cpuset.cpus` as the kernel has it now."""
        return (CPUSET / self.container_cgroup(cid) / "cpuset.cpus").read_text().strip()

    def live_allowed_cpus(self, cid: str) -> str:
        """The `Cpus_allowed_list` of the container's first process now (host /proc)."""
        return allowed_cpus(self.container_pid(cid))

    # ------------------------------------------------------------------ cleanup
    def shim_sockets(self) -> set[Path]:
        """Where the sockets of this daemon's shims are (or were), in SHIM_SOCKETS: containerd
        1.7 names each by the hash of its address, namespace and shim id. The shims' bundles in
        the state directory are named by the ids that may name a shim (a pod's containers
        share the shim of its sandbox: only the sandbox's socket exists)."""
        bundles = self.base / "state" / "io.containerd.runtime.v2.task" / NAMESPACE
        sockets = set()
        with contextlib.suppress(OSError):
            for bundle in bundles.iterdir():
                key = f"{self.address}/{NAMESPACE}/{bundle.name}".encode()
                sockets.add(SHIM_SOCKETS / hashlib.sha256(key).hexdigest())
        return sockets

    def own_processes(self, *, bed_binaries_only: bool = False) -> list[int]:
        """The processes whose command line names the base directory (the daemon, its shims;
        with `bed_binaries_only`, only those running a binary of the bed)."""
        mine = f"{self.base}/".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if mine not in (entry / "cmdline").read_bytes():
                    continue
                if not bed_binaries_only or os.readlink(entry / "exe").startswith(f"{BIN}/"):
                    pids.append(int(entry.name))
        return pids

    def own_mounts(self) -> list[str]:
        """Mount points at or below the base directory, deepest first."""
        prefix = str(self.base)
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split(" ")[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
        return sorted(points, key=lambda p: -p.count("/"))

    def own_cgroups(self) -> list[str]:
        """The hierarchies that still hold `cgroup_root`."""
        rel = self.cgroup_root.lstrip("/")
        return [str(h / rel) for h in CGROUP.iterdir() if (h / rel).is_dir()]

    def close(self) -> None:
        """Remove every pod, the daemon, its shims, mounts, cgroups and base directory."""
        self.cri.close()
        if self.running():
            self.cri.reconnect()
            with contextlib.suppress(CriError):
                for pod in self.cri.list_pods():
                    with contextlib.suppress(CriError):
                        self.cri.remove_pod(pod.id)
            self.cri.close()
        self.stop_daemon()
        self._shim_sockets |= self.shim_sockets()
        for _ in range(50):
            pids = self.own_processes(bed_binaries_only=True)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for socket in self._shim_sockets:
            for path in (socket, Path(f"{socket}.debug")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        for point in self.own_mounts():
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        remove_cgroup_trees([self.cgroup_root.lstrip("/")])
        shutil.rmtree(self.base, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this bed is still on the host (nothing after `close()`)."""
        left = [f"process {pid}" for pid in self.own_processes()]
        left += [f"mount {point}" for point in self.own_mounts()]
        left += [f"cgroup {group}" for group in self.own_cgroups()]
        left += [f"shim socket {s}" for s in self._shim_sockets if s.exists()]
        if self.base.exists():
            left.append(f"directory {self.base}")
        return left


@contextlib.contextmanager
def cri_testbed(
    base: Path,
    api_dir: Path,
    *,
    nri_request_timeout: str = "2s",
    nri_registration_timeout: str = "5s",
) -> Iterator[CriBed]:
    """A started bed below `base` with its image imported; closed afterwards, whatever
    happened. BedDidNotStart when the daemon does not start; AssertionError naming what
    `close()` could not remove."""
    base.mkdir(parents=True, exist_ok=True)
    bed = CriBed(
        base,
        api_dir,
        nri_request_timeout=nri_request_timeout,
        nri_registration_timeout=nri_registration_timeout,
    )
    try:
        bed.start()
        began = time.monotonic()
        bed.import_image(base)
        bed.timings["image import"] = time.monotonic() - began
        yield bed
    finally:
        bed.close()
    left = bed.leftovers()
    assert not left, f"the CRI test bed left behind: {left}"
