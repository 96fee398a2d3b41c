"""Leader election around the controller: `ControllerService` competes for the Lease, runs a
fresh `Controller` for each leadership term (informers cannot be restarted, and a new term
must not trust a cache from before the gap), stops it when the term ends, and goes back to
standing by. A standby does nothing but answer `health()`.

Stopping (`stop()`, on SIGTERM) stops the controller first and only then releases the Lease,
so the next leader never overlaps with this one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from corepin.agent.cluster.controller.controller import (
    BINDINGS,
    TOPOLOGIES,
    Controller,
    ControllerSettings,
)
from corepin.agent.cluster.controller.metrics import ControllerMetrics
from corepin.core.errors import ApiForbidden, ApiNotFound, EnvironmentProblem
from corepin.kube.client import KubeClient, Resource
from corepin.kube.leader import LeaderElector
from corepin.kube.resources import LEASES, PODS

log = logging.getLogger("corepin.controller")


def check_api(client: KubeClient, lease_namespace: str) -> None:
    """Start-up check: the API server answers, and serves and lets us read what the controller
    needs. Raises ApiUnreachable / ApiError / EnvironmentProblem (exit 4) saying what to do."""
    client.check()
    needed: list[tuple[Resource, str]] = [
        (PODS, "pods"),
        (BINDINGS, "the CRD podcpubindings.corepin.io"),
        (TOPOLOGIES, "the CRD nodecputopologies.corepin.io"),
    ]
    for resource, what in needed:
        try:
            client.list(resource, limit=1)
        except ApiNotFound:
            raise EnvironmentProblem(
                f"the API server does not serve {what}: install the CRDs first "
                "(kubectl apply -k deploy/crd)",
                reason="crd_missing",
            ) from None
        except ApiForbidden as exc:
            raise EnvironmentProblem(
                f"not allowed to list {resource}: {exc.api_message} (apply deploy/rbac)",
                reason="forbidden",
            ) from None
    try:
        client.list(LEASES, lease_namespace, limit=1)
    except ApiForbidden as exc:
        raise EnvironmentProblem(
            f"not allowed to read Leases in namespace {lease_namespace}: {exc.api_message} "
            "(apply deploy/rbac, or choose --lease-namespace)",
            reason="forbidden",
        ) from None


class ControllerService:
    """One contender: standby until it holds the Lease, then a running Controller."""

    def __init__(
        self,
        client: KubeClient,
        settings: ControllerSettings,
        *,
        lease_namespace: str,
        lease_name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        metrics: ControllerMetrics | None = None,
        controller_factory: Callable[[], Controller] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.identity = identity
        self.metrics = metrics or ControllerMetrics()
        self._factory = controller_factory or (
            lambda: Controller(client, settings, metrics=self.metrics)
        )
        self.elector = LeaderElector(
            client,
            lease_namespace,
            lease_name,
            identity,
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
            on_started_leading=self._started_leading,
            on_stopped_leading=self._stopped_leading,
            on_new_leader=self._new_leader,
        )
        self.retry_period = retry_period
        self._lock = threading.Lock()
        self._controller: Controller | None = None
        self._terms = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.metrics.watch(lambda: self._controller)
        self.metrics.leader.set(0)

    # ------------------------------------------------------------------ state
    @property
    def controller(self) -> Controller | None:
        """The controller of the current leadership term (None while standing by)."""
        with self._lock:
            return self._controller

    @property
    def is_leader(self) -> bool:
        return self.controller is not None

    @property
    def terms(self) -> int:
        """How many leadership terms this replica has started."""
        with self._lock:
            return self._terms

    def health(self) -> tuple[bool, str]:
        """(healthy, what it is doing) for /healthz."""
        if self._stopping.is_set():
            return False, "stopping"
        if self._thread is None or not self._thread.is_alive():
            return False, "leader election is not running"
        controller = self.controller
        if controller is None:
            leader = self.elector.leader
            return True, f"standby (leader: {leader})" if leader else "standby"
        return controller.health()

    # ------------------------------------------------------------------ callbacks
    def _started_leading(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            controller = self._factory()
            self._controller = controller
            self._terms += 1
        log.info("event=leading identity=%s", self.identity)
        self.metrics.leader.set(1)
        controller.start()

    def _stopped_leading(self) -> None:
        with self._lock:
            controller, self._controller = self._controller, None
        self.metrics.leader.set(0)
        if controller is not None:
            controller.stop()
            log.info("event=standing_by identity=%s", self.identity)

    def _new_leader(self, identity: str) -> None:
        if identity != self.identity:
            log.info("event=new_leader leader=%s identity=%s", identity, self.identity)

    # ------------------------------------------------------------------ lifecycle
    def _run(self) -> None:
        while not self._stopping.is_set():
            self.elector.run()
            if self._stopping.wait(self.retry_period):
                return

    def start(self) -> ControllerService:
        log.info("event=standby identity=%s lease=%s/%s", self.identity, *self._lease())
        self._thread = threading.Thread(target=self._run, name="controller-election", daemon=True)
        self._thread.start()
        return self

    def _lease(self) -> tuple[str, str]:
        return self.elector.namespace, self.elector.name

    def stop(self, timeout: float = 4.0) -> bool:
        """Stop the controller, then release the Lease; True when done within `timeout`."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        with self._lock:
            controller, self._controller = self._controller, None
        clean = True
        if controller is not None:
            clean = controller.stop(max(0.1, (deadline - time.monotonic()) * 0.6))
            self.metrics.leader.set(0)
        self.elector.stop()  # wakes the election loop, which releases the Lease if held
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
            clean = clean and not self._thread.is_alive()
        log.info("event=stopped identity=%s clean=%s", self.identity, clean)
        return clean
