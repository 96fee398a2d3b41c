"""Lease-based leader election (coordination.k8s.io/v1 Lease), client-go's algorithm:

- acquire: read the Lease; create it when missing; take it when it has no holder, or when its
  record has not changed for `lease_duration` seconds *as observed locally* (the holder's
  clock is never compared with ours); the write carries the resourceVersion that was read, so
  of two contenders exactly one wins (the other gets 409 Conflict and tries again later);
- renew: every `retry_period` the leader writes a new renewTime; when it has not managed to
  renew for `renew_deadline` seconds it stops leading (`on_stopped_leading`);
- release (on `stop()` while leading): holderIdentity emptied and leaseDurationSeconds set to
  1, so another contender can take over at once.

`run()` blocks: it acquires, calls `on_started_leading`, renews until leadership is lost or
`stop()` is called, then calls `on_stopped_leading` and returns (a process that lost the lease
should stop doing leader work; client-go's RunOrDie does the same). `start()` runs it in a
thread.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corepin.core.errors import (
    ApiAlreadyExists,
    ApiConflict,
    ApiError,
    ApiNotFound,
    ApiUnreachable,
    RequestError,
)
from corepin.kube.client import KubeClient
from corepin.kube.models import ObjectView
from corepin.kube.resources import LEASES

Obj = dict[str, Any]
log = logging.getLogger("corepin.kube.leader")


def micro_time(when: dt.datetime) -> str:
    """metav1.MicroTime text."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration: int
    acquire_time: str
    renew_time: str
    transitions: int

    @classmethod
    def of(cls, lease: Obj) -> LeaseRecord:
        spec = ObjectView(lease).spec
        return cls(
            str(spec.get("holderIdentity") or ""),
            int(spec.get("leaseDurationSeconds") or 0),
            str(spec.get("acquireTime") or ""),
            str(spec.get("renewTime") or ""),
            int(spec.get("leaseTransitions") or 0),
        )


class LeaderElector:
    """One contender for the Lease `namespace/name`."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        release_on_stop: bool = True,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        rng: random.Random | None = None,
    ) -> None:
        if not identity:
            raise RequestError("leader election needs a non-empty identity")
        if not lease_duration > renew_deadline > retry_period > 0:
            raise RequestError(
                "leader election needs lease_duration > renew_deadline > retry_period > 0"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_stop = release_on_stop
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._monotonic = monotonic
        self._wall = wall_clock
        self._rng = rng or random.Random()
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._reported_leader = ""
        self._leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ state
    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    @property
    def leader(self) -> str:
        """The holder identity last observed ("" when none)."""
        return self._observed.holder if self._observed else ""

    # ------------------------------------------------------------------ one step
    def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the lease; True when we hold it afterwards."""
        now = self._wall()
        try:
            lease = self.client.get(LEASES, self.name, self.namespace)
        except ApiNotFound:
            return self._create(now)
        except (ApiError, ApiUnreachable) as exc:
            log.warning(
                "lease=%s/%s event=read_failed error=%r", self.namespace, self.name, str(exc)
            )
            return False
        record = LeaseRecord.of(lease)
        if record != self._observed:
            self._observe(record)
        held_by_other = record.holder and record.holder != self.identity
        if held_by_other and self._observed_at + self.lease_duration > self._monotonic():
            return False
        spec: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.lease_duration),
            "renewTime": micro_time(now),
        }
        if record.holder == self.identity:
            spec["acquireTime"] = record.acquire_time or micro_time(now)
            spec["leaseTransitions"] = record.transitions
        else:
            spec["acquireTime"] = micro_time(now)
            spec["leaseTransitions"] = record.transitions + (1 if record.holder else 0)
        lease["spec"] = {**ObjectView(lease).spec, **spec}
        try:
            written = self.client.replace(LEASES, lease, self.namespace)
        except ApiConflict:
            return False
        except (ApiError, ApiUnreachable) as exc:
            log.warning(
                "lease=%s/%s event=write_failed error=%r", self.namespace, self.name, str(exc)
            )
            return False
        self._observe(LeaseRecord.of(written))
        return True

    def _create(self, now: dt.datetime) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": round(self.lease_duration),
                "acquireTime": micro_time(now),
                "renewTime": micro_time(now),
                "leaseTransitions": 0,
            },
        }
        try:
            written = self.client.create(LEASES, body, self.namespace)
        except (ApiAlreadyExists, ApiConflict):
            return False
        except (ApiError, ApiUnreachable) as exc:
            log.warning(
                "lease=%s/%s event=create_failed error=%r", self.namespace, self.name, str(exc)
            )
            return False
        self._observe(LeaseRecord.of(written))
        return True

    def _observe(self, record: LeaseRecord) -> None:
        self._observed = record
        self._observed_at = self._monotonic()
        if record.holder and record.holder != self._reported_leader:
            self._reported_leader = record.holder
            if self._on_new_leader is not None:
                try:
                    self._on_new_leader(record.holder)
                except Exception:
                    log.exception("lease=%s/%s event=callback_failed", self.namespace, self.name)

    def release(self) -> bool:
        """Give the lease up if we hold it (True when released)."""
        try:
            lease = self.client.get(LEASES, self.name, self.namespace)
        except (ApiError, ApiUnreachable):
            return False
        record = LeaseRecord.of(lease)
        if record.holder != self.identity:
            return False
        now = micro_time(self._wall())
        lease["spec"] = {
            **ObjectView(lease).spec,
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "renewTime": now,
            "acquireTime": now,
            "leaseTransitions": record.transitions,
        }
        try:
            written = self.client.replace(LEASES, lease, self.namespace)
        except (ApiError, ApiUnreachable):
            return False
        self._observe(LeaseRecord.of(written))
        return True

    # ------------------------------------------------------------------ loop
    def _sleep(self, seconds: float) -> bool:
        """Wait with jitter; True when stopped meanwhile."""
        return self._stop.wait(seconds * (1.0 + self._rng.uniform(0, 0.2)))

    def run(self) -> None:
        """Acquire, lead, renew; returns when leadership is lost or `stop()` was called."""
        while not self._stop.is_set():
            if self.try_acquire_or_renew():
                break
            if self._sleep(self.retry_period):
                return
        else:
            return
        self._leading.set()
        log.info(
            "lease=%s/%s event=started_leading identity=%s",
            self.namespace,
            self.name,
            self.identity,
        )
        self._call(self._on_started)
        last_renew = self._monotonic()
        try:
            while not self._stop.wait(self.retry_period):
                if self.try_acquire_or_renew():
                    last_renew = self._monotonic()
                elif self._monotonic() - last_renew > self.renew_deadline or (
                    self.leader and self.leader != self.identity
                ):
                    log.warning(
                        "lease=%s/%s event=lost identity=%s",
                        self.namespace,
                        self.name,
                        self.identity,
                    )
                    break
        finally:
            self._leading.clear()
            if self._stop.is_set() and self.release_on_stop:
                self.release()
            self._call(self._on_stopped)

    def _call(self, callback: Callable[[], None] | None) -> None:
        if callback is None:
            return
        try:
            callback()
        except Exception:
            log.exception("lease=%s/%s event=callback_failed", self.namespace, self.name)

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self.run, name=f"leader-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop (releasing the lease when leading); True when the loop ended in time."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()
