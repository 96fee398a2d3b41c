"""Host mode behind the node API: `HostBackend` implements `corepin.agent.ports.NodeBackend`
with a `HostAgent` and its state directory. No command serves it (the node agent is what
serves the API); the API's own tests do, on this machine.

- `snapshot` reads the committed state (no lock), `statuses` tells which runs live;
- `allocate` pins a running process (`adopt.pin_process`) or, with cgroups, a container
  found in the kubelet's layout by its container id (`adopt.pin_container`);
- `release` is `corepin release ID`;
- `subscribe` follows the state file: other `corepin run` processes change it too, so a
  poller (started with the first subscription) publishes the state whenever the file was
  replaced; changes made through this backend are published at once.

HostAgent keeps per-transaction caches, so calls are serialised by one lock.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from corepin.agent.host.adopt import pin_container, pin_process
from corepin.agent.host.agent import HostAgent
from corepin.agent.host.release import release
from corepin.agent.host.run import RunSpec
from corepin.agent.ports import (
    AllocationSpec,
    ContainerRef,
    FeedSubscription,
    ProcessRef,
    StateFeed,
)
from corepin.core.errors import InputError
from corepin.state.store import StateStore

if TYPE_CHECKING:
    from corepin.state.model import Assignment, HostState
    from corepin.topology.model import Topology

#: Seconds between two looks at the state file while someone watches.
POLL_INTERVAL = 0.2


class HostBackend:
    """A `NodeBackend` for standalone host mode (see the module docstring)."""

    def __init__(
        self,
        agent: HostAgent,
        *,
        node_name: str | None = None,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.agent = agent
        self._node_name = node_name or os.uname().nodename
        self._lock = threading.RLock()
        self._feed = StateFeed()
        self._poll_interval = poll_interval
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()
        self._seen: tuple[int, int, int] | None = None

    @property
    def node_name(self) -> str:
        return self._node_name

    @property
    def state_path(self) -> str:
        return StateStore(self.agent.settings.state_dir).path

    # ------------------------------------------------------------------ reads
    def topology(self) -> Topology:
        with self._lock:
            return self.agent.topology

    def snapshot(self) -> HostState:
        with self._lock:
            return self.agent.read_state()

    def statuses(self, state: HostState) -> Mapping[str, str]:
        with self._lock:
            self.agent.read_state()  # a fresh process table for this answer
            return self.agent.liveness.statuses(state)

    # ------------------------------------------------------------------ writes
    def allocate(self, spec: AllocationSpec) -> Assignment:
        options = dict(spec.options)
        if spec.kind == "shared":
            if spec.level != "cpu":
                raise InputError("a level applies to allocations of CPUs only", reason="bad_usage")
        else:
            options.setdefault("level", spec.level)
        owner = spec.owner
        with self._lock:
            if isinstance(owner, ProcessRef):
                run = RunSpec(
                    exclusive=spec.cpus if spec.kind != "shared" else None,
                    with_shared=spec.kind == "mixed",
                    options=options,
                )
                assignment = pin_process(
                    self.agent, owner.pid, run, kind=spec.kind, name=spec.name or None
                )
            elif isinstance(owner, ContainerRef):
                if spec.kind not in ("exclusive", "shared"):
                    raise InputError(
                        f"host mode pins containers exclusive or shared, not {spec.kind}",
                        reason="bad_kind",
                    )
                if not owner.container_id:
                    raise InputError(
                        "host mode finds a container by its container id: give container_id",
                        reason="bad_usage",
                    )
                assignment = pin_container(
                    self.agent,
                    owner.container_id,
                    exclusive=spec.cpus if spec.kind == "exclusive" else None,
                    options=options,
                )
            else:
                raise InputError(
                    "an allocation is for a process or a container: give one", reason="no_owner"
                )
            self._publish()
            return assignment

    def release(self, assignment_id: str) -> Assignment:
        with self._lock:
            before = self.agent.read_state().get(assignment_id)
            release(self.agent, assignment_id)
            self._publish()
            if before is None:  # released meanwhile by someone else: nothing more to tell
                raise InputError(f"no allocation {assignment_id!r}", reason="unknown_id")
            return before

    # ------------------------------------------------------------------ changes
    def subscribe(self) -> FeedSubscription:
        with self._lock:
            if self._feed.current is None:
                self._publish()
            if self._poller is None:
                self._poller = threading.Thread(
                    target=self._poll, name="corepin-state-poller", daemon=True
                )
                self._poller.start()
        return self._feed.subscribe()

    def close(self) -> None:
        """Stop following the state file and end every subscription."""
        self._stop.set()
        self._feed.close()
        poller = self._poller
        if poller is not None:
            poller.join(timeout=5)

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.state_path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _publish(self) -> None:
        """Read the state (under the lock) and publish it when it changed."""
        with self._lock:
            self._seen = self._signature()
            state = self.agent.read_state()
        current = self._feed.current
        if current is None or current != state:
            self._feed.publish(state)

    def _poll(self) -> None:
        log = logging.getLogger("corepin.agent.host.backend")
        while not self._stop.wait(self._poll_interval):
            if self._signature() == self._seen:
                continue
            try:
                self._publish()
            except Exception as exc:  # a torn or refused state: try again next time
                log.warning("state_read_failed error=%s", exc)
