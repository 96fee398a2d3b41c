"""What the surfaces of an agent (the node gRPC API, reports) need from it: `NodeBackend`.

The Kubernetes node agent and host mode (`corepin.agent.host.backend.HostBackend`) implement
this protocol; `corepin.api.grpc.server.GrpcServer` serves any object that does. It lives in
the agent layer so that an agent can implement it, and use `StateFeed`, without importing
the surfaces above it (one-way layers).

```python
class NodeBackend(Protocol):
    node_name: str                                       # attribute or property
    def topology(self) -> Topology: ...
    def snapshot(self) -> HostState: ...
    def statuses(self, state: HostState) -> Mapping[str, str]: ...
    def allocate(self, spec: AllocationSpec) -> Assignment: ...
    def release(self, assignment_id: str) -> Assignment: ...
    def subscribe(self) -> Subscription: ...
```

Errors are corepin errors (`corepin.core.errors`): the server maps InputError to
INVALID_ARGUMENT (an unknown id, reason `unknown_id`, to NOT_FOUND), AllocationError to
RESOURCE_EXHAUSTED or FAILED_PRECONDITION, EnvironmentProblem to UNAVAILABLE.

`StateFeed` is the change feed behind `subscribe()`: the agent calls `publish(state)` after
each committed change; every subscription sees the newest state (a slow reader skips states
in between, never gets an old one after a newer one, and never holds more than one).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Protocol

from corepin.core.errors import RequestError
from corepin.core.record import field, record

if TYPE_CHECKING:
    from corepin.state.model import Assignment, HostState
    from corepin.topology.model import Topology

#: `AllocationSpec.kind` values (the state's assignment kinds).
SPEC_KINDS: Final = ("exclusive", "mixed", "share", "shared")


@record
class ProcessRef:
    """An existing process to allocate for (host mode: pinned with its whole tree)."""

    pid: int

    def __post_init__(self) -> None:
        if isinstance(self.pid, bool) or not isinstance(self.pid, int) or self.pid <= 0:
            raise RequestError(f"process id must be a positive integer, got {self.pid!r}")


@record
class ContainerRef:
    """A container to allocate for: a pod's uid and container name, and/or the runtime's id."""

    pod_uid: str = ""
    container: str = ""
    namespace: str = ""
    pod: str = ""
    container_id: str = ""

    def __post_init__(self) -> None:
        if not self.container_id and not (self.pod_uid and self.container):
            raise RequestError(
                "a container is named by its pod uid and container name, or its container id"
            )


@record
class AllocationSpec:
    """What an Allocate call asks for.

    - `kind`: exclusive | mixed (exclusive CPUs plus the shared pool) | share | shared;
    - `cpus`: how many CPUs (kinds exclusive, mixed and share; ignored for shared);
    - `level`: exclusiveness level, `options`: request and policy options as
      `corepin allocate --option` takes them (`smt`, `numa`, `workload`, ...);
    - `owner`: the process or container it is for; `name`: a label for reports.
    """

    kind: str
    cpus: int = 0
    level: str = "cpu"
    options: Mapping[str, str] = field(default_factory=dict)
    owner: ProcessRef | ContainerRef | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in SPEC_KINDS:
            raise RequestError(
                f"kind must be one of {', '.join(SPEC_KINDS)}, got {self.kind!r}",
                reason="bad_kind",
            )
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus < 0:
            raise RequestError(f"cpus must be a non-negative integer, got {self.cpus!r}")
        if self.kind != "shared" and self.cpus == 0:
            raise RequestError(
                f"a {self.kind} allocation needs a CPU count >= 1", reason="bad_count"
            )
        object.__setattr__(self, "options", dict(self.options))

    @classmethod
    def build(
        cls,
        *,
        kind: str = "",
        cpus: int = 0,
        level: str = "",
        options: Mapping[str, str] | None = None,
        owner: ProcessRef | ContainerRef | None = None,
        name: str = "",
    ) -> AllocationSpec:
        """A spec with the API's defaults: kind exclusive when `cpus` > 0, else shared; level
        cpu."""
        return cls(
            kind=kind or ("exclusive" if cpus > 0 else "shared"),
            cpus=cpus,
            level=level or "cpu",
            options=dict(options or {}),
            owner=owner,
            name=name,
        )


class Subscription(Protocol):
    """A reader of an agent's state changes (`NodeBackend.subscribe`)."""

    def next(self, timeout: float) -> HostState | None:
        """The newest state not yet returned, waiting up to `timeout` seconds for one (None
        when nothing new came, or after `close`). The first call returns the current state."""
        ...

    def close(self) -> None:
        """Stop reading; a `next` blocked in another thread returns None."""
        ...


class NodeBackend(Protocol):
    """An agent as its surfaces see it (see the module docstring)."""

    @property
    def node_name(self) -> str:
        """The node's name (host mode: the host name)."""
        ...

    def topology(self) -> Topology:
        """The machine the agent runs on."""
        ...

    def snapshot(self) -> HostState:
        """The current state (committed; never a half-done change)."""
        ...

    def statuses(self, state: HostState) -> Mapping[str, str]:
        """Assignment id -> running | lingering | dead | unknown, for the assignments of
        `state` the agent can tell (may be empty)."""
        ...

    def allocate(self, spec: AllocationSpec) -> Assignment:
        """Decide, record and enforce an allocation; the assignment recorded."""
        ...

    def release(self, assignment_id: str) -> Assignment:
        """End an allocation; the assignment as it was (InputError `unknown_id` if absent)."""
        ...

    def subscribe(self) -> Subscription:
        """A new reader of state changes (first `next` returns the current state)."""
        ...


class StateFeed:
    """Latest-value broadcast of states to any number of subscriptions (thread-safe)."""

    def __init__(self, initial: HostState | None = None) -> None:
        self._cond = threading.Condition()
        self._state = initial
        self._serial = 0 if initial is None else 1
        self._closed = False

    @property
    def current(self) -> HostState | None:
        with self._cond:
            return self._state

    def publish(self, state: HostState) -> None:
        """Make `state` the newest one and wake every subscription."""
        with self._cond:
            self._state = state
            self._serial += 1
            self._cond.notify_all()

    def close(self) -> None:
        """End the feed: every subscription's `next` returns None from now on."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def subscribe(self) -> FeedSubscription:
        return FeedSubscription(self)

    # ------------------------------------------------------------------ for FeedSubscription
    def _wait_newer(
        self, seen: int, timeout: float, sub: FeedSubscription
    ) -> tuple[int, HostState | None]:
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._closed or sub.closed or (self._serial > seen and self._state is not None)
                ),
                timeout=max(0.0, timeout),
            )
            if self._closed or sub.closed or self._serial <= seen or self._state is None:
                return seen, None
            return self._serial, self._state

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


class FeedSubscription:
    """One reader of a `StateFeed`."""

    def __init__(self, feed: StateFeed) -> None:
        self._feed = feed
        self._seen = 0
        self.closed = False

    def next(self, timeout: float) -> HostState | None:
        self._seen, state = self._feed._wait_newer(self._seen, timeout, self)
        return state

    def close(self) -> None:
        self.closed = True
        self._feed._wake()
