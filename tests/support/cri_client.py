"""A small typed client of the Kubernetes CRI (runtime.v1), for the NRI test bed.

`load_cri_api(dest)` generates the Python messages and stubs from the CRI's own api.proto (the
one shipped with the fetched test bed, `cri_harness.CRI_PROTO`) with grpcio-tools, into `dest`,
and imports them (once per process). `CriClient` drives a containerd's CRI over its unix socket
the way a kubelet would, with the kubelet's conventions where the tests care about them:

- pods run in the host's network namespace (no CNI in the bed), each container in its own PID
  namespace; the pod cgroup is `<cgroup root>/pod<uid>` (Guaranteed), or below `burstable/` or
  `besteffort/` like the kubelet's cgroupfs layout;
- a container's CPU request and limit become shares, quota and period as the kubelet maps them
  (`kubelet_cpu`); its output goes to `<pod log directory>/<name>/0.log` in the CRI log format,
  read back with `output`.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

#: the kubelet's CFS period (µs) and its floors for shares and quota
CFS_PERIOD = 100_000
MIN_SHARES = 2
MIN_QUOTA = 1_000
#: NamespaceMode of the CRI
POD, CONTAINER, NODE = 0, 1, 2
#: ContainerState of the CRI
CREATED, RUNNING, EXITED, UNKNOWN = 0, 1, 2, 3
#: what a test container runs first: print its own allowed CPUs (`reported_cpus` reads it)
REPORT_CPUS = "grep Cpus_allowed_list /proc/self/status"

_GOGO_IMPORT = re.compile(r'^\s*import\s+"[^"]*gogo\.proto"\s*;\s*$', re.M)
_GOGO_FILE_OPTION = re.compile(r"^\s*option\s+\(gogoproto\.[^)]*\)\s*=\s*[^;]*;\s*$", re.M)
_GOGO_FIELD_OPTION = re.compile(r"\(gogoproto\.[^)]*\)\s*=\s*[^,\]]*")
_loaded: tuple[ModuleType, ModuleType] | None = None


class CriError(RuntimeError):
    """A CRI call failed (the message names the call and the runtime's answer)."""


def load_cri_api(proto: Path, dest: Path) -> tuple[ModuleType, ModuleType]:
    """The CRI's messages and stubs (`cri_api_pb2`, `cri_api_pb2_grpc`), generated from
    `proto` into `dest` the first time (gogoproto's import and options stripped: they only
    steer Go's generator), then imported; the same modules on later calls."""
    global _loaded
    if _loaded is not None:
        return _loaded
    from grpc_tools import protoc  # a dev tool, needed only where the bed runs

    text = proto.read_text()
    text = _GOGO_IMPORT.sub("", text)
    text = _GOGO_FILE_OPTION.sub("", text)
    text = _GOGO_FIELD_OPTION.sub("", text)
    text = re.sub(r"\[\s*(,\s*)*\]", "", text)  # option lists left empty
    dest.mkdir(parents=True, exist_ok=True)
    # its own file name: api.proto would clash with other generated modules named api_pb2
    (dest / "cri_api.proto").write_text(text)
    include = str(Path(protoc.__file__).parent / "_proto")
    status = protoc.main(
        [
            "protoc",
            f"-I{dest}",
            f"-I{include}",
            f"--python_out={dest}",
            f"--grpc_python_out={dest}",
            str(dest / "cri_api.proto"),
        ]
    )
    if status != 0:
        raise CriError(f"protoc could not compile the CRI's api.proto ({proto}): exit {status}")
    sys.path.insert(0, str(dest))
    import cri_api_pb2
    import cri_api_pb2_grpc

    _loaded = (cri_api_pb2, cri_api_pb2_grpc)
    return _loaded


@dataclass(frozen=True)
class CpuResources:
    """A container's CFS settings as the kubelet computes them from its CPU request and limit."""

    shares: int
    quota: int
    period: int = CFS_PERIOD


def kubelet_cpu(request_milli: int | None, limit_milli: int | None) -> CpuResources:
    """The kubelet's mapping: shares = request·1024/1000 (at least 2; the limit stands in for
    a missing request), quota = limit·period/1000 (at least 1000; 0 without a limit)."""
    milli = request_milli if request_milli is not None else (limit_milli or 0)
    shares = max(MIN_SHARES, milli * 1024 // 1000)
    quota = max(MIN_QUOTA, limit_milli * CFS_PERIOD // 1000) if limit_milli else 0
    return CpuResources(shares, quota)


def parse_cri_log(text: str) -> list[tuple[str, str]]:
    """(stream, line) of each full line of a CRI container log (`<time> <stream> <P|F> <text>`;
    partial records joined to the full line they end in)."""
    lines: list[tuple[str, str]] = []
    partial: dict[str, str] = {}
    for record in text.splitlines():
        parts = record.split(" ", 3)
        if len(parts) < 3:
            continue
        _time, stream, tag = parts[:3]
        body = parts[3] if len(parts) == 4 else ""
        if tag == "P":
            partial[stream] = partial.get(stream, "") + body
        else:
            lines.append((stream, partial.pop(stream, "") + body))
    return lines


@dataclass
class Pod:
    """A pod sandbox the client ran: its id, uid, cgroup parent, log directory and config."""

    id: str
    uid: str
    cgroup_parent: str
    log_directory: Path
    config: Any


class CriClient:
    """The CRI of one containerd (`address`: its gRPC unix socket), kubelet style."""

    def __init__(
        self,
        address: str,
        api: tuple[ModuleType, ModuleType],
        *,
        image: str,
        log_root: Path,
        cgroup_root: str,
        timeout: float = 30,
    ) -> None:
        self.address = address
        self.pb, self._grpc = api
        self.image = image
        self.log_root = log_root
        self.cgroup_root = cgroup_root.rstrip("/")
        self.timeout = timeout
        #: pods run through this client, by sandbox id; container id -> its pod and log path
        self.pods: dict[str, Pod] = {}
        self.logs: dict[str, Path] = {}
        self._channel: grpc.Channel | None = None
        self.reconnect()

    # ------------------------------------------------------------------ plumbing
    def reconnect(self) -> None:
        """A new channel to the daemon (after it restarted)."""
        self.close()
        self._channel = grpc.insecure_channel(f"unix://{self.address}")
        self.runtime = self._grpc.RuntimeServiceStub(self._channel)
        self.images = self._grpc.ImageServiceStub(self._channel)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def call(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        """RuntimeService.`method`(request) (ImageService's for the Image* methods); CriError
        with the runtime's answer when it fails."""
        service = self.runtime if hasattr(self.runtime, method) else self.images
        try:
            return getattr(service, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise CriError(f"CRI {method} failed: {exc.code()}: {exc.details()}") from None

    def version(self) -> str:
        """The runtime's name and version."""
        answer = self.call("Version", self.pb.VersionRequest(version="v1"))
        return f"{answer.runtime_name} {answer.runtime_version}"

    def runtime_ready(self) -> bool:
        """Whether the runtime says it is ready (RuntimeReady; the network is not needed)."""
        answer = self.call("Status", self.pb.StatusRequest(), timeout=5)
        return any(c.type == "RuntimeReady" and c.status for c in answer.status.conditions)

    def image_present(self, ref: str) -> bool:
        request = self.pb.ImageStatusRequest(image=self.pb.ImageSpec(image=ref))
        return bool(self.call("ImageStatus", request).image.id)

    # ------------------------------------------------------------------ pods
    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        uid: str | None = None,
        *,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        cgroup_parent: str | None = None,
        qos: str = "guaranteed",
    ) -> str:
        """Run a pod sandbox (host network); its id. Its cgroup is `cgroup_parent`, by default
        `<cgroup root>[/burstable|/besteffort]/pod<uid>` by `qos`, like the kubelet's."""
        uid = uid or str(uuid.uuid4())
        if cgroup_parent is None:
            tier = "" if qos == "guaranteed" else f"/{qos}"
            cgroup_parent = f"{self.cgroup_root}{tier}/pod{uid}"
        log_directory = self.log_root / f"{namespace}_{name}_{uid}"
        log_directory.mkdir(parents=True, exist_ok=True)
        pb = self.pb
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            log_directory=str(log_directory),
            labels={
                "io.kubernetes.pod.name": name,
                "io.kubernetes.pod.namespace": namespace,
                "io.kubernetes.pod.uid": uid,
                **(labels or {}),
            },
            annotations=dict(annotations or {}),
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=NODE, pid=CONTAINER, ipc=POD)
                ),
            ),
        )
        answer = self.call("RunPodSandbox", pb.RunPodSandboxRequest(config=config))
        pod_id: str = answer.pod_sandbox_id
        self.pods[pod_id] = Pod(pod_id, uid, cgroup_parent, log_directory, config)
        return pod_id

    def stop_pod(self, pod_id: str) -> None:
        self.call("StopPodSandbox", self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id))

    def remove_pod(self, pod_id: str) -> None:
        """Remove the pod sandbox (stopped first) with its containers."""
        self.stop_pod(pod_id)
        self.call("RemovePodSandbox", self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id))
        self.pods.pop(pod_id, None)

    def list_pods(self) -> list[Any]:
        """Every pod sandbox of the runtime (PodSandbox messages)."""
        return list(self.call("ListPodSandbox", self.pb.ListPodSandboxRequest()).items)

    def pod_status(self, pod_id: str) -> Any:
        request = self.pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id)
        return self.call("PodSandboxStatus", request).status

    # ------------------------------------------------------------------ containers
    def create_container(
        self,
        pod_id: str,
        name: str,
        command: Sequence[str] | None = None,
        *,
        cpu_request_milli: int | None = None,
        cpu_limit_milli: int | None = None,
        cpu_shares: int | None = None,
        cpu_quota: int | None = None,
        cpu_period: int | None = None,
        cpuset_cpus: str = "",
        memory_limit: int = 0,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Create a container in pod `pod_id` (run through this client); its id. CPU settings
        as the kubelet maps the request and limit (`kubelet_cpu`), each overridable; `command`
        replaces the image's entrypoint (which sleeps for good)."""
        pod = self.pods[pod_id]
        cpu = kubelet_cpu(cpu_request_milli, cpu_limit_milli)
        pb = self.pb
        (pod.log_directory / name).mkdir(parents=True, exist_ok=True)
        log_path = f"{name}/0.log"
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=self.image),
            command=list(command or []),
            envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            labels={
                "io.kubernetes.container.name": name,
                "io.kubernetes.pod.uid": pod.uid,
                **(labels or {}),
            },
            annotations=dict(annotations or {}),
            log_path=log_path,
            linux=pb.LinuxContainerConfig(
                resources=pb.LinuxContainerResources(
                    cpu_shares=cpu.shares if cpu_shares is None else cpu_shares,
                    cpu_quota=cpu.quota if cpu_quota is None else cpu_quota,
                    cpu_period=cpu.period if cpu_period is None else cpu_period,
                    cpuset_cpus=cpuset_cpus,
                    memory_limit_in_bytes=memory_limit,
                ),
                security_context=pb.LinuxContainerSecurityContext(
                    namespace_options=pb.NamespaceOption(network=NODE, pid=CONTAINER, ipc=POD)
                ),
            ),
        )
        request = pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=config, sandbox_config=pod.config
        )
        cid: str = self.call("CreateContainer", request).container_id
        self.logs[cid] = pod.log_directory / log_path
        return cid

    def start(self, cid: str) -> None:
        self.call("StartContainer", self.pb.StartContainerRequest(container_id=cid))

    def create_and_start(
        self, pod_id: str, name: str, command: Sequence[str] | None = None, **kwargs: Any
    ) -> str:
        """`create_container` then `start`; the container's id."""
        cid = self.create_container(pod_id, name, command, **kwargs)
        self.start(cid)
        return cid

    def update_resources(
        self,
        cid: str,
        *,
        cpuset_cpus: str = "",
        cpuset_mems: str = "",
        cpu_shares: int = 0,
        cpu_quota: int = 0,
        cpu_period: int = 0,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """UpdateContainerResources with the settings given (the runtime keeps those left at
        0 or empty as they were)."""
        resources = self.pb.LinuxContainerResources(
            cpuset_cpus=cpuset_cpus,
            cpuset_mems=cpuset_mems,
            cpu_shares=cpu_shares,
            cpu_quota=cpu_quota,
            cpu_period=cpu_period,
        )
        request = self.pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=resources, annotations=dict(annotations or {})
        )
        self.call("UpdateContainerResources", request)

    def stop(self, cid: str, timeout: int = 0) -> None:
        """Stop the container (SIGKILL after `timeout` seconds; at once by default)."""
        request = self.pb.StopContainerRequest(container_id=cid, timeout=timeout)
        self.call("StopContainer", request, timeout=self.timeout + timeout)

    def remove(self, cid: str) -> None:
        self.call("RemoveContainer", self.pb.RemoveContainerRequest(container_id=cid))
        self.logs.pop(cid, None)

    def list_containers(self, pod_id: str | None = None, state: int | None = None) -> list[Any]:
        """The runtime's containers (Container messages), of one pod or in one state if asked."""
        pb = self.pb
        flt = pb.ContainerFilter(pod_sandbox_id=pod_id or "")
        if state is not None:
            flt.state.CopyFrom(pb.ContainerStateValue(state=state))
        return list(self.call("ListContainers", pb.ListContainersRequest(filter=flt)).containers)

    def container_status(self, cid: str) -> Any:
        """The container's ContainerStatus message."""
        request = self.pb.ContainerStatusRequest(container_id=cid)
        return self.call("ContainerStatus", request).status

    def container_info(self, cid: str) -> dict[str, Any]:
        """The runtime's verbose information on the container (its `pid`, `runtimeSpec`...)."""
        request = self.pb.ContainerStatusRequest(container_id=cid, verbose=True)
        info: dict[str, Any] = json.loads(self.call("ContainerStatus", request).info["info"])
        return info

    def wait_state(self, cid: str, state: int, timeout: float = 15) -> Any:
        """The container's status once it is in `state`; AssertionError when time is up."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.container_status(cid)
            if status.state == state or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status.state == state, f"container {cid[:12]} is in state {status.state}"
        return status

    # ------------------------------------------------------------------ output
    def output(self, cid: str, stream: str | None = None) -> list[str]:
        """The full lines the container wrote so far (of `stream`, stdout or stderr, if
        given), from its CRI log."""
        with contextlib.suppress(FileNotFoundError):
            text = self.logs[cid].read_text(errors="replace")
            return [line for s, line in parse_cri_log(text) if stream in (None, s)]
        return []

    def wait_output(self, cid: str, lines: int = 1, timeout: float = 15) -> list[str]:
        """The container's first `lines` lines, once written; AssertionError when time is up
        (with its state and what it wrote)."""
        deadline = time.monotonic() + timeout
        while len(got := self.output(cid)) < lines and time.monotonic() < deadline:
            time.sleep(0.05)
        if len(got) < lines:
            state = self.container_status(cid)
            raise AssertionError(
                f"container {cid[:12]} wrote {got!r}, not {lines} lines "
                f"(state {state.state}, exit code {state.exit_code}, {state.message!r})"
            )
        return got[:lines]

    def reported_cpus(self, cid: str, timeout: float = 15) -> str:
        """The CPU list a container started with `REPORT_CPUS` printed first (its
        Cpus_allowed_list when its first command ran), e.g. "0-1"."""
        line = self.wait_output(cid, 1, timeout)[0]
        key, _, value = line.partition(":")
        assert key == "Cpus_allowed_list", f"the container's first line is {line!r}"
        return value.strip()


def report_then(command: str = "exec sleep 2147483647") -> list[str]:
    """A container command that first prints its allowed CPUs (`REPORT_CPUS`), then runs the
    shell command `command` (by default: sleeps for good)."""
    return ["/bin/sh", "-c", f"{REPORT_CPUS}; {command}"]
