"""`AgentClient`: the typed client of a running agent's node API (`corepin report --agent`).

Targets: a unix socket path (`/run/corepin/corepin.sock`, or `unix:PATH`), or `HOST:PORT`
over TLS (`tls_ca` to verify the server; `tls_cert`/`tls_key` when the server asks for a
client certificate). A failed call raises the corepin error of the same exit code
(`corepin.api.grpc.errors.error_from_rpc`); an agent that cannot be reached is an
EnvironmentProblem (exit 4) naming the target.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corepin.agent.ports import AllocationSpec
from corepin.api.grpc import convert
from corepin.api.grpc.errors import error_from_rpc
from corepin.api.grpc.gen.v1alpha1 import pinning_pb2 as pb
from corepin.api.grpc.gen.v1alpha1 import pinning_pb2_grpc, topology_pb2_grpc
from corepin.api.grpc.gen.v1alpha1 import topology_pb2 as tpb
from corepin.core.errors import EnvironmentProblem, InputError
from corepin.core.record import field, record
from corepin.state.model import Assignment, HostState
from corepin.topology.model import Topology

DEFAULT_TIMEOUT: Final = 10.0


@record
class AgentState:
    """What List answers: the node's name, its state and the statuses the agent knows."""

    node_name: str
    state: HostState
    statuses: dict[str, str] = field(default_factory=dict)


def channel_target(target: str) -> tuple[str, bool]:
    """(what grpc dials, whether it is a unix socket) for a target as users write it."""
    if target.startswith("unix:"):
        path = target[len("unix:") :]
        path = path[2:] if path.startswith("//") else path
        return f"unix:{os.path.abspath(path)}", True
    if "/" in target or target.endswith(".sock") or ":" not in target:
        return f"unix:{os.path.abspath(target)}", True
    return target, False


class AgentClient:
    """One channel to an agent; use as a context manager or `close()` it."""

    def __init__(
        self,
        target: str,
        *,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        server_name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.target = target
        self.timeout = timeout
        dial, unix = channel_target(target)
        if unix:
            path = dial[len("unix:") :]
            if not os.path.exists(path):
                raise EnvironmentProblem(
                    f"no corepin agent socket at {path}: is the agent running (and is this the "
                    "path of its --grpc-socket)?",
                    reason="agent_unreachable",
                )
            self._channel = grpc.insecure_channel(dial)
        else:
            if not tls_ca:
                raise InputError(
                    f"the agent at {target} is reached over TCP only with TLS: give the CA "
                    "that signed its certificate",
                    reason="plaintext_tcp",
                )
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca),
                private_key=_read(tls_key) if tls_key else None,
                certificate_chain=_read(tls_cert) if tls_cert else None,
            )
            options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
            self._channel = grpc.secure_channel(dial, credentials, options=options)
        self._topology = topology_pb2_grpc.TopologyStub(self._channel)
        self._pinning = pinning_pb2_grpc.CPUPinningStub(self._channel)
        self._health: Any = health_pb2_grpc.HealthStub(self._channel)  # stubs lack Check

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ calls
    def topology(self) -> tuple[str, Topology]:
        """(node name, topology)."""
        try:
            answer: tpb.GetTopologyResponse = self._topology.GetTopology(
                tpb.GetTopologyRequest(), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        return answer.node_name, convert.topology_from_message(answer.topology)

    def list_state(self) -> AgentState:
        try:
            answer: pb.ListResponse = self._pinning.List(pb.ListRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        state, statuses = convert.state_from_message(answer.state)
        return AgentState(answer.state.node_name, state, statuses)

    def allocate(self, spec: AllocationSpec) -> Assignment:
        try:
            answer: pb.AllocateResponse = self._pinning.Allocate(
                convert.request_from_spec(spec), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        return convert.assignment_from_message(answer.allocation)

    def release(self, assignment_id: str) -> Assignment:
        try:
            answer: pb.ReleaseResponse = self._pinning.Release(
                pb.ReleaseRequest(id=assignment_id), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        return convert.assignment_from_message(answer.released)

    def watch(self, *, skip_initial: bool = False) -> WatchStream:
        """The agent's change stream; iterate it, `cancel()` it from any thread."""
        call = self._pinning.Watch(pb.WatchRequest(skip_initial=skip_initial))
        return WatchStream(call, self.target)

    def health(self, service: str = "") -> str:
        """The health check answer for `service` ("" = the server): SERVING, NOT_SERVING..."""
        try:
            answer: health_pb2.HealthCheckResponse = self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, self.target) from None
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


class WatchStream:
    """The events of one Watch call (messages of `pinning_pb2.WatchEvent`)."""

    def __init__(self, call: Any, target: str) -> None:
        self._call = call
        self._target = target

    def __iter__(self) -> Iterator[pb.WatchEvent]:
        try:
            yield from self._call
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.CANCELLED:
                return
            raise error_from_rpc(exc, self._target) from None

    def cancel(self) -> None:
        self._call.cancel()


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise InputError(
            f"cannot read {path!r}: {exc.strerror or exc}", reason="unreadable_file"
        ) from exc
