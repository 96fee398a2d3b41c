"""The node gRPC API server: `GrpcServer` serves a `NodeBackend`.

Services: `corepin.v1alpha1.Topology` (GetTopology), `corepin.v1alpha1.CPUPinning` (List,
Allocate, Release, Watch), the standard `grpc.health.v1.Health` (SERVING while the server
runs, NOT_SERVING from the start of a stop) and server reflection (v1alpha).

Where it listens (`Listen`):
- a unix socket (default `/run/corepin/corepin.sock`): created with mode 0600 (the process
  umask is narrowed while it is bound, then the mode is checked), its directory created with
  mode 0700 when missing. A stale socket left by a dead server is removed; a socket another
  server still answers on, or a path that is not a socket, is refused (EnvironmentProblem,
  exit 4) - never replaced;
- TCP only with TLS (`tls_cert` and `tls_key`; with `client_ca`, clients must present a
  certificate it signed). Plain TCP is refused (InputError, exit 2).

Errors of the backend become status codes (`corepin.api.grpc.errors`); anything else is
INTERNAL with a one-line message (the traceback goes to the log, never to the client).

Watch streams hold a worker thread each; at most `max_watches` run at once (more are refused
with RESOURCE_EXHAUSTED) so that unary calls always find a worker. `stop()` ends them within
about `WATCH_TICK` seconds plus the grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from functools import partial
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from corepin.agent.ports import NodeBackend, Subscription
from corepin.api.grpc import convert
from corepin.api.grpc.errors import REASON_KEY, status_for
from corepin.api.grpc.gen.v1alpha1 import pinning_pb2 as pb
from corepin.api.grpc.gen.v1alpha1 import pinning_pb2_grpc, topology_pb2_grpc
from corepin.api.grpc.gen.v1alpha1 import topology_pb2 as tpb
from corepin.core.errors import CorepinError, EnvironmentProblem, InputError
from corepin.core.record import record

if TYPE_CHECKING:
    from corepin.state.model import HostState

__all__ = [
    "DEFAULT_SOCKET",
    "PINNING_SERVICE",
    "TOPOLOGY_SERVICE",
    "GrpcServer",
    "Listen",
    "NodeBackend",
    "PinningMetrics",
]

DEFAULT_SOCKET: Final = "/run/corepin/corepin.sock"
TOPOLOGY_SERVICE: Final = tpb.DESCRIPTOR.services_by_name["Topology"].full_name
PINNING_SERVICE: Final = pb.DESCRIPTOR.services_by_name["CPUPinning"].full_name
HEALTH_SERVICE: Final = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
#: Longest unix socket path (sockaddr_un.sun_path holds 108 bytes with the final NUL).
MAX_SOCKET_PATH: Final = 107
#: How often a Watch stream looks whether its call or the server has ended (seconds).
WATCH_TICK: Final = 0.25

log = logging.getLogger("corepin.api.grpc")
_T = TypeVar("_T")


@record
class Listen:
    """Where the server listens: a unix `socket` path, or a TCP `address` (HOST:PORT; `:PORT`
    is every interface) with TLS files."""

    socket: str | None = None
    address: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None

    def __post_init__(self) -> None:
        if (self.socket is None) == (self.address is None):
            raise InputError("listen on a unix socket or a TCP address (one of them)")
        if self.socket is not None:
            if not self.socket:
                raise InputError("the gRPC socket path is empty", reason="bad_socket")
            if self.tls_cert or self.tls_key or self.client_ca:
                raise InputError(
                    "TLS files apply to a TCP address, not to a unix socket", reason="bad_usage"
                )
            if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
                raise InputError(
                    f"gRPC socket path {self.socket!r} is {len(os.fsencode(self.socket))} bytes "
                    f"long; a unix socket path has at most {MAX_SOCKET_PATH}",
                    reason="bad_socket",
                )
            return
        if not self.tls_cert or not self.tls_key:
            raise InputError(
                f"refusing to serve the node API over plain TCP on {self.address}: give a TLS "
                "certificate and key, or use a unix socket",
                reason="plaintext_tcp",
            )
        grpc_address(self.address or "")

    @classmethod
    def unix(cls, path: str = DEFAULT_SOCKET) -> Listen:
        return cls(socket=path)

    @classmethod
    def tcp(
        cls, address: str, *, cert: str | None, key: str | None, client_ca: str | None = None
    ) -> Listen:
        return cls(address=address, tls_cert=cert, tls_key=key, client_ca=client_ca)


def grpc_address(address: str) -> str:
    """HOST:PORT as gRPC spells it (`:PORT` = every interface; IPv6 hosts in brackets)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise InputError(f"bad address {address!r}: expected HOST:PORT", reason="bad_address")
    if not host:
        host = "[::]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise InputError(
            f"cannot read {what} {path!r}: {exc.strerror or exc}", reason="unreadable_file"
        ) from exc


def prepare_socket_path(path: str) -> None:
    """Make `path` free for a new socket: create its directory (0700) when missing, remove a
    stale socket; refuse a live socket or anything that is not a socket."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot create the directory of the gRPC socket {parent!r}: {exc.strerror or exc}",
            reason="socket_dir",
        ) from exc
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot inspect {path!r}: {exc.strerror or exc}", reason="socket_path"
        ) from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise EnvironmentProblem(
            f"{path!r} exists and is not a socket: refusing to replace it (remove it or choose "
            "another socket path)",
            reason="socket_path_taken",
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        try:
            os.unlink(path)  # stale: nobody listens on it any more
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot remove the stale socket {path!r}: {exc.strerror or exc}",
                reason="socket_path",
            ) from exc
        log.info("removed_stale_socket path=%s", path)
        return
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot tell whether {path!r} is in use: {exc.strerror or exc}", reason="socket_path"
        ) from exc
    finally:
        probe.close()
    raise EnvironmentProblem(
        f"another process serves on {path!r}: is a corepin agent already running?",
        reason="socket_in_use",
    )


class PinningMetrics(Protocol):
    """What the server counts of the Allocate calls it serves (the node agent hands it its
    metrics)."""

    def pinning_request(self) -> None: ...

    def pinning_error(self, reason: str) -> None: ...


class _Calls:
    """Runs a backend call for an RPC: corepin errors become status codes."""

    def __init__(self, metrics: PinningMetrics | None) -> None:
        self.metrics = metrics

    def run(self, context: grpc.ServicerContext, method: str, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except CorepinError as exc:
            code = status_for(exc)
            if self.metrics is not None and method == "Allocate":
                self.metrics.pinning_error(exc.reason)
            log.info("rpc_failed method=%s code=%s reason=%s", method, code.name, exc.reason)
            context.set_trailing_metadata(((REASON_KEY, exc.reason),))
            context.abort(code, exc.message)
        except Exception as exc:
            if self.metrics is not None and method == "Allocate":
                self.metrics.pinning_error("internal")
            log.exception("rpc_internal_error method=%s", method)
            context.abort(
                grpc.StatusCode.INTERNAL,
                f"internal error: {type(exc).__name__}: {exc} (a bug: see the agent's log)",
            )
        raise AssertionError("unreachable: abort raises")  # pragma: no cover


class _TopologyService:
    def __init__(self, backend: NodeBackend, calls: _Calls) -> None:
        self._backend = backend
        self._calls = calls

    def GetTopology(
        self, request: tpb.GetTopologyRequest, context: grpc.ServicerContext
    ) -> tpb.GetTopologyResponse:
        topology = self._calls.run(context, "GetTopology", self._backend.topology)
        return tpb.GetTopologyResponse(
            node_name=self._backend.node_name, topology=convert.topology_message(topology)
        )


class _PinningService:
    def __init__(
        self,
        backend: NodeBackend,
        calls: _Calls,
        stopping: threading.Event,
        max_watches: int,
    ) -> None:
        self._backend = backend
        self._calls = calls
        self._stopping = stopping
        self._watch_slots = threading.BoundedSemaphore(max_watches)
        self._max_watches = max_watches

    def _state(self) -> pb.NodeState:
        state = self._backend.snapshot()
        return convert.state_message(
            state, self._backend.statuses(state), node_name=self._backend.node_name
        )

    def List(self, request: pb.ListRequest, context: grpc.ServicerContext) -> pb.ListResponse:
        return pb.ListResponse(state=self._calls.run(context, "List", self._state))

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        metrics = self._calls.metrics
        if metrics is not None:
            metrics.pinning_request()

        def allocate() -> pb.Allocation:
            spec = convert.spec_from_request(request)
            assignment = self._backend.allocate(spec)
            state = self._backend.snapshot()
            return convert.allocation_message(assignment, state.shared_pool)

        return pb.AllocateResponse(allocation=self._calls.run(context, "Allocate", allocate))

    def Release(
        self, request: pb.ReleaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseResponse:
        def release() -> pb.Allocation:
            if not request.id:
                raise InputError("give the id of the allocation to release", reason="bad_usage")
            before = self._backend.snapshot().shared_pool
            return convert.allocation_message(self._backend.release(request.id), before)

        return pb.ReleaseResponse(released=self._calls.run(context, "Release", release))

    def Watch(
        self, request: pb.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.WatchEvent]:
        if not self._watch_slots.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this agent serves at most {self._max_watches} watches at once",
            )
        try:
            subscription = self._calls.run(context, "Watch", self._backend.subscribe)
            context.add_callback(subscription.close)
            try:
                yield from self._watch(request, context, subscription)
            finally:
                subscription.close()
        finally:
            self._watch_slots.release()

    def _watch(
        self,
        request: pb.WatchRequest,
        context: grpc.ServicerContext,
        subscription: Subscription,
    ) -> Iterator[pb.WatchEvent]:
        def live() -> bool:
            return context.is_active() and not self._stopping.is_set()

        previous: HostState | None = None
        while previous is None and live():
            previous = subscription.next(WATCH_TICK)
        if previous is None:
            return
        if not request.skip_initial:
            statuses = self._calls.run(context, "Watch", partial(self._backend.statuses, previous))
            yield convert.initial_event(previous, statuses, node_name=self._backend.node_name)
        while live():
            state = subscription.next(WATCH_TICK)
            if state is None:
                continue
            statuses = self._calls.run(context, "Watch", partial(self._backend.statuses, state))
            yield from convert.change_events(previous, state, statuses)
            previous = state


class GrpcServer:
    """The node API on one listener (see the module docstring). Use as a context manager or
    call `start()` and `stop()`."""

    def __init__(
        self,
        backend: NodeBackend,
        listen: Listen,
        *,
        max_workers: int = 16,
        max_watches: int = 8,
        metrics: PinningMetrics | None = None,
    ) -> None:
        if max_watches >= max_workers:
            raise InputError("max_watches must leave workers for unary calls")
        self.backend = backend
        self.listen = listen
        self._max_workers = max_workers
        self._max_watches = max_watches
        self._metrics = metrics
        self._server: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self._stopping = threading.Event()
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        """What a client dials: `unix:PATH` or `HOST:PORT` (with the bound port)."""
        if self.listen.socket is not None:
            return f"unix:{os.path.abspath(self.listen.socket)}"
        host = grpc_address(self.listen.address or "").rpartition(":")[0]
        return f"{host}:{self.port}"

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the gRPC server is already started")
        calls = _Calls(self._metrics)
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix="corepin-grpc"
            ),
            options=[("grpc.so_reuseport", 0)],
        )
        topology_pb2_grpc.add_TopologyServicer_to_server(
            _TopologyService(self.backend, calls), server
        )
        pinning_pb2_grpc.add_CPUPinningServicer_to_server(
            _PinningService(self.backend, calls, self._stopping, self._max_watches), server
        )
        self._health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (TOPOLOGY_SERVICE, PINNING_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server
        )
        self.port = self._bind(server)
        server.start()
        self._server = server
        for name in ("", TOPOLOGY_SERVICE, PINNING_SERVICE):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("grpc_serving endpoint=%s", self.endpoint)

    def _bind(self, server: grpc.Server) -> int:
        listen = self.listen
        if listen.socket is not None:
            path = os.path.abspath(listen.socket)
            prepare_socket_path(path)
            old = os.umask(0o177)  # the socket is born 0600: no window where others may connect
            try:
                port = self._add_port(lambda: server.add_insecure_port(f"unix:{path}"), path)
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode != 0o600:  # pragma: no cover - chmod of our own socket does not fail
                raise EnvironmentProblem(f"gRPC socket {path!r} has mode {mode:o}, not 600")
            return port
        cert = _read_file(listen.tls_cert or "", "TLS certificate")
        key = _read_file(listen.tls_key or "", "TLS key")
        ca = _read_file(listen.client_ca, "client CA") if listen.client_ca else None
        credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )
        address = grpc_address(listen.address or "")
        return self._add_port(lambda: server.add_secure_port(address, credentials), address)

    @staticmethod
    def _add_port(add: Callable[[], int], where: str) -> int:
        try:
            port = add()
        except RuntimeError as exc:  # grpc raises it when the bind fails
            raise EnvironmentProblem(
                f"cannot listen on {where}: {exc}", reason="grpc_bind"
            ) from exc
        if not port:
            raise EnvironmentProblem(f"cannot listen on {where}", reason="grpc_bind")
        return port

    def stop(self, grace: float = 2.0) -> None:
        """Stop serving: health NOT_SERVING, watches end, calls get `grace` seconds."""
        server = self._server
        if server is None:
            return
        self._server = None
        self._stopping.set()
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        server.stop(grace).wait(grace + 2 * WATCH_TICK + 1)
        if self.listen.socket is not None:
            with contextlib.suppress(OSError):  # grpc removes it; a crashed server did not
                os.unlink(os.path.abspath(self.listen.socket))
        log.info("grpc_stopped endpoint=%s", self.endpoint)

    def __enter__(self) -> GrpcServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
