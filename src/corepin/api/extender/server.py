"""`corepin extender`: the kube-scheduler extender v1 over HTTP.

Routes (every answer is JSON as `wire` writes it):

- `POST /filter` (ExtenderArgs -> ExtenderFilterResult): nodes named by `NodeNames` are
  answered by `NodeNames`, nodes sent as `Nodes` by `Nodes` (the passing node objects, as
  received); a node without a NodeCPUTopology goes to `FailedAndUnresolvableNodes`, a node
  that cannot take the pod (not ready, stale, not enough CPUs at the asked level...) to
  `FailedNodes`, each with the reason;
- `POST /prioritize` (ExtenderArgs -> HostPriorityList): 0..10 per node (the placement
  score 0..100 scaled; a node that does not pass scores 0);
- `POST /bind` (ExtenderBindingArgs -> ExtenderBindingResult): the pod is placed (counted in
  flight on the node, so the next pod does not get the same CPUs) and bound through
  `pods/binding`; `Error` says why when it cannot be. Only pods kube-scheduler could have
  handed this extender are bound: a pending pod whose `spec.schedulerName` is one of
  `scheduler_names` (default: `default-scheduler`, the profile of the shipped
  KubeSchedulerConfiguration), onto a node that exists and passes the checks the scheduler
  makes itself (cordon, taints the pod does not tolerate, nodeSelector - the same code as
  `corepin scheduler`'s), and that can still give the pod its CPUs;
- `POST /preempt` (ExtenderPreemptionArgs -> ExtenderPreemptionResult): keeps the candidate
  nodes where the pod fits once the proposed victims' CPUs are released;
- `GET /healthz` (200 once the informers have listed everything), `GET /metrics`.

Limits: a body larger than `max_body` bytes is refused with 413 before it is read, a body
without a length with 411, a request that is not an extender message with 400 and the
message's `Error` set; a request (TLS handshake, head and body) must arrive whole within
`timeout` seconds. Served by `corepin.api.http` (an event loop reads whole requests, a few
worker threads answer them, slow clients cost no thread): each answer is a few milliseconds of
Python at 1,000 nodes, so a framework would add nothing but a dependency. With `tls` it serves
HTTPS and (with a client CA, `corepin.api.webhook.tls.ServingCertificate`) requires a client
certificate that CA signed, as kube-scheduler's extender `tlsConfig` sends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, Final

from corepin.api.extender import wire
from corepin.api.extender.ports import ExtenderMetrics, KubeObject, NodeCatalog
from corepin.api.http import HealthAndMetrics, Limits, PageHandler, RequestHandler, ThreadedServer
from corepin.core.errors import ApiNotFound, CorepinError
from corepin.kube.client import KubeClient
from corepin.kube.models import ObjectView, PodView
from corepin.kube.resources import NODES, PODS
from corepin.placement.cluster import Cluster
from corepin.placement.request import PodRequest
from corepin.placement.taints import node_refusal

if TYPE_CHECKING:
    import ssl

    from prometheus_client import CollectorRegistry

log = logging.getLogger("corepin.api.extender")

#: 16 MiB: a NodeList of 1,000 real nodes is a few megabytes
MAX_BODY: Final = 16 * 1024 * 1024
#: seconds a whole request (TLS handshake, head and body) may take to arrive
TIMEOUT: Final = 10.0
#: seconds a kept-alive connection may wait for kube-scheduler's next request
IDLE_TIMEOUT: Final = 60.0
#: connections open at once; kube-scheduler keeps a few
MAX_CONNECTIONS: Final = 256
#: threads answering whole requests
WORKERS: Final = 4
JSON: Final = "application/json"
#: the pods' spec.schedulerName that /bind accepts by default: kube-scheduler's default profile
#: (the one the shipped KubeSchedulerConfiguration runs)
SCHEDULER_NAMES: Final = ("default-scheduler",)

#: a message of the extender protocol (an ExtenderFilterResult, a HostPriorityList...)
Message = dict[str, Any] | list[dict[str, Any]]
Answer = tuple[int, Message]


class ExtenderService:
    """The verbs, without HTTP (the server calls them with the body bytes)."""

    def __init__(
        self,
        cluster: Cluster,
        catalog: NodeCatalog,
        client: KubeClient,
        *,
        metrics: ExtenderMetrics | None = None,
        clock: Callable[[], float] = time.time,
        scheduler_names: Collection[str] = SCHEDULER_NAMES,
    ) -> None:
        self.cluster = cluster
        self.catalog = catalog
        self.client = client
        self.metrics = metrics
        self.clock = clock
        self.scheduler_names = frozenset(scheduler_names)

    def _request(self, body: bytes) -> tuple[PodRequest, list[str], list[dict[str, Any]] | None]:
        args = wire.decode(body, wire.EXTENDER_ARGS)
        if not isinstance(args, dict):
            raise wire.WireError("the request must be an ExtenderArgs JSON object")
        pod = wire.pod_of(args)
        names, nodes = wire.node_names_of(args)
        return self.catalog.request_of(pod), names, nodes

    def filter(self, body: bytes) -> Answer:
        try:
            request, names, nodes = self._request(body)
        except CorepinError as exc:
            return 400, wire.filter_result(error=exc.message)
        answers = self.cluster.evaluate(request, names, self.clock())
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for a in answers:
            if a.ok:
                passed.append(a.node)
            elif a.unresolvable:
                unresolvable[a.node] = a.reason
            else:
                failed[a.node] = a.reason
            if not a.ok and self.metrics is not None:
                self.metrics.failed(a.code)
        if nodes is None:
            return 200, wire.filter_result(names=passed, failed=failed, unresolvable=unresolvable)
        items = [n for n, a in zip(nodes, answers, strict=True) if a.ok]
        return 200, wire.filter_result(nodes=items, failed=failed, unresolvable=unresolvable)

    def prioritize(self, body: bytes) -> Answer:
        try:
            request, names, _ = self._request(body)
        except CorepinError as exc:
            return 400, {"Error": exc.message}
        answers = self.cluster.evaluate(request, names, self.clock())
        return 200, wire.host_priorities([(a.node, a.extender) for a in answers])

    def _refuse_binding(self, message: str) -> Answer:
        if self.metrics is not None:
            self.metrics.binding("refused")
        log.info("event=bind_refused why=%s", message)
        return 200, wire.binding_result(message)

    def _node(self, name: str) -> KubeObject | None:
        """The Node object (the informer's copy, else one GET); None when there is none."""
        found = self.catalog.cached_node(name)
        if found is not None:
            return found
        try:
            return self.client.get(NODES, name)
        except ApiNotFound:
            return None

    def bind_refusal(self, pod: KubeObject, node_name: str, node: KubeObject | None) -> str | None:
        """Why this extender must not bind `pod` to `node` (None: it may): the pod was not
        handed to it by one of `scheduler_names`, is bound already, or the node does not exist
        or fails the scheduler's own node checks (cordon, taints, nodeSelector)."""
        view = PodView(pod)
        key = f"{view.namespace}/{view.name}"
        scheduler = view.spec.get("schedulerName") or "default-scheduler"
        if scheduler not in self.scheduler_names:
            accepted = ", ".join(sorted(self.scheduler_names))
            return (
                f"pod {key} has schedulerName {scheduler!r}; this extender binds only pods of "
                f"{accepted} (--scheduler-name)"
            )
        if view.node_name:
            return f"pod {key} is bound to {view.node_name} already"
        if node is None:
            return f"node {node_name!r} does not exist"
        why = node_refusal(node, pod)
        if why is not None:
            return f"pod {key} may not go to {why[1]}"
        return None

    def bind(self, body: bytes) -> Answer:
        try:
            namespace, name, uid, node = wire.binding_args(wire.decode(body, wire.BINDING_ARGS))
        except CorepinError as exc:
            return 400, wire.binding_result(exc.message)
        pod = self.catalog.cached_pod(name, namespace)
        try:
            # the raw uid, as ever (one that is not a string is never `uid`)
            if pod is None or (uid and ObjectView(pod).metadata.get("uid") != uid):
                pod = self.client.get(PODS, name, namespace)
        except CorepinError as exc:
            return 200, wire.binding_result(f"cannot read pod {namespace}/{name}: {exc}")
        try:
            node_object = self._node(node)
        except CorepinError as exc:
            return 200, wire.binding_result(f"cannot read node {node}: {exc}")
        if uid and ObjectView(pod).metadata.get("uid") != uid:
            return self._refuse_binding(f"pod {namespace}/{name} is not the pod of UID {uid}")
        why = self.bind_refusal(pod, node, node_object)
        if why is not None:
            return self._refuse_binding(why)
        request = self.catalog.request_of(pod)
        now = self.clock()
        answer = self.cluster.evaluate(request, [node], now)[0]
        if not answer.ok:
            return self._refuse_binding(f"pod {namespace}/{name} no longer fits: {answer.reason}")
        if answer.fit is not None:
            self.cluster.assume(request, node, answer.fit, now)
        try:
            self.client.bind(namespace, name, node, uid=uid or None)
        except CorepinError as exc:
            self.cluster.forget_pod(request.uid)
            if self.metrics is not None:
                self.metrics.binding("failed")
            return 200, wire.binding_result(f"binding pod {namespace}/{name} to {node}: {exc}")
        if self.metrics is not None:
            self.metrics.binding("bound")
        log.info("event=bound pod=%s/%s node=%s", namespace, name, node)
        return 200, wire.binding_result()

    def preempt(self, body: bytes) -> Answer:
        try:
            args = wire.decode(body, wire.PREEMPTION_ARGS)
            if not isinstance(args, dict):
                raise wire.WireError("the request must be an ExtenderPreemptionArgs object")
            request = self.catalog.request_of(wire.pod_of(args))
            victims = wire.victims_of(args)
        except CorepinError as exc:
            return 400, {"Error": exc.message}
        now = self.clock()
        keep = {
            node: found
            for node, found in victims.items()
            if self.cluster.fits_without(request, node, found[0], now).ok
        }
        return 200, wire.preemption_result(keep)

    def answer(self, verb: str, body: bytes) -> Answer:
        handler = {
            "filter": self.filter,
            "prioritize": self.prioritize,
            "bind": self.bind,
            "preempt": self.preempt,
        }[verb]
        if self.metrics is None:
            return handler(body)
        with self.metrics.timed(verb):
            code, payload = handler(body)
        self.metrics.request(verb, str(code))
        return code, payload


class ExtenderServer(ThreadedServer):
    """The HTTP side (see the module docstring); `start()` binds, `stop()` returns within a
    few seconds. With `tls` (a callable giving the context of each new connection) it serves
    HTTPS. /healthz (`ready`) and /metrics (the registry `metrics`) are the pages every corepin
    server serves (`corepin.api.http.HealthAndMetrics`)."""

    VERBS: Final = ("filter", "prioritize", "bind", "preempt")

    thread_name = "corepin-extender"
    serves = "the extender"
    bind_reason = "listen_failed"
    logger = log
    serving_event = "event=serving"

    def __init__(
        self,
        service: ExtenderService,
        address: str,
        *,
        ready: Callable[[], bool] = lambda: True,
        metrics: CollectorRegistry | None = None,
        max_body: int = MAX_BODY,
        timeout: float = TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        workers: int = WORKERS,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self.service = service
        super().__init__(
            address,
            limits=Limits(
                request_timeout=timeout,
                idle_timeout=IDLE_TIMEOUT,
                max_connections=max_connections,
                workers=workers,
                max_body=max_body,
            ),
            tls=tls,
        )
        self.pages = HealthAndMetrics(metrics, ready)
        self.max_body = max_body
        self.timeout = timeout

    def _handler(self) -> type[RequestHandler]:
        return _handler_for(self)


def _handler_for(owner: ExtenderServer) -> type[RequestHandler]:
    class Handler(PageHandler):
        server_version = "corepin-extender"
        pages = owner.pages

        def _send(self, code: int, body: bytes, content_type: str = JSON) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, code: int, message: str) -> None:
            self.close_connection = True
            self._send(code, wire.encode({"Error": message}))

        def do_POST(self) -> None:
            verb = self.path.split("?", 1)[0].strip("/")
            if verb not in ExtenderServer.VERBS:
                self._refuse(404, f"no such verb {verb!r}: POST /filter, /prioritize, /bind")
                return
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                self._refuse(411, "send the body with a Content-Length")
                return
            length_text = self.headers.get("Content-Length")
            if length_text is None or not length_text.strip().isdigit():
                self._refuse(411, "a Content-Length is required")
                return
            length = int(length_text)
            if length > owner.max_body:
                self._refuse(413, f"the body is larger than {owner.max_body} bytes")
                return
            body = self.rfile.read(length)  # (read whole by the server, within its deadline)
            if len(body) < length:
                self.close_connection = True
                return
            try:
                code, payload = owner.service.answer(verb, body)
                data = wire.encode(payload)
            except Exception:
                log.exception("event=answer_failed verb=%s", verb)
                code, data = 500, wire.encode({"Error": "internal error (a bug: see the log)"})
            self._send(code, data)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0].strip("/") in ExtenderServer.VERBS:
                self.send_response(405)
                self.send_header("Allow", "POST")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_page(True)  # /healthz, /metrics; 404 for anything else

        def _not_allowed(self) -> None:
            self.send_response(405)
            self.send_header("Allow", "GET, POST")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_PUT = do_DELETE = do_PATCH = _not_allowed

    return Handler


__all__ = ["MAX_BODY", "ExtenderServer", "ExtenderService"]
