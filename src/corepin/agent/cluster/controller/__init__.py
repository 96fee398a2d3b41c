"""`corepin controller`: the cluster-wide tidying the node agents cannot do themselves.

Modules (imported on demand; this package imports nothing):
- `rules`      the decisions about PodCPUBindings, pure (no API, no clock)
- `controller` `Controller`: informers, the handlers that queue work keys, the worker
- `sync`       `BindingSync`: the work of a binding key and of a node key (decide, then write)
- `heartbeats` `Heartbeats`: the heartbeat check of NodeCPUTopologies (marks stale ones)
- `reservation_rules` the decisions about CPUReservations, pure
- `reservations` `ReservationSync`: the work of a reservation key (decide, then write)
- `writer`     `BindingWriter`: the writes to PodCPUBindings with optimistic concurrency
- `service`    `ControllerService`: leader election around a `Controller` per leadership term,
               health; `check_api` (the start-up check)
- `metrics`    `ControllerMetrics`: the `corepin_controller_*` Prometheus metrics

One replica acts at a time: the holder of the Lease `--lease-namespace/--lease-name`
(coordination.k8s.io/v1). A standby only serves /healthz and /metrics. What the leader does:

1. **Validates user-written PodCPUBindings.**
   *Who wrote a binding*: the node agent puts the label `app.kubernetes.io/managed-by:
   corepin-agent` on every binding it creates (`corepin.kube.models.agent_binding_labels()`);
   every binding without it is user-written (a person, a tool, the scheduler's `--bind-cpus`).
   The label only says "a record, not a request": neither the controller nor the agent acts on
   such a binding as a request. It is no proof of who wrote it - any tenant allowed to create
   bindings can set it - so a labelled binding counts as the agent's record (never judged, its
   CPUs taken on its node) only when the node's NodeCPUTopology status, which only that
   node's agent writes, lists an allocation of the same pod uid (owner reference), container
   and CPUs for every row of its `spec.containers`. Unconfirmed it counts for nothing; the
   node is decided again when the agent's status changes. Agent bindings are deleted with
   their pod like any other.
   A user-written binding is checked, the first failing rule deciding:
   - the spec can be read (else `Failed`, `InvalidSpec`, naming the field and value);
   - its pod `spec.podName` exists in the binding's namespace (else `Failed`, `PodNotFound`);
   - every `spec.containers[].name` is a container (or init container) of the pod
     (`UnknownContainer`), and the per-container CPU sets do not overlap each other, nor the
     pod-wide `spec.cpuSet` when some container of the pod has no row of its own and so uses it
     (`OverlappingContainers`);
   - the pod is bound to a node (else `Pending`, `PodNotScheduled`: a pod not yet scheduled
     has no node to check the CPUs against; it is checked again when it is bound);
   - that node has a readable NodeCPUTopology (else `Pending`, `NodeTopologyMissing` /
     `NodeTopologyInvalid`: the agent has not published it; checked again when it does);
   - every app container the binding gives CPUs to (a row of its own; the pod-wide
     `spec.cpuSet` for a pod of one container) is eligible as for the annotations - a whole
     CPU limit >= 1 equal to its request - and is given exactly as many CPUs as that limit
     (else `Failed`, `IneligibleContainer`): a binding never gives a container more CPUs than
     its limits ask for, so removing its CFS quota never lifts a limit;
   - every CPU named exists on the node (`UnknownCPUs`), is online (`OfflineCPUs`), is among
     the CPUs the agent's status reports - shared pool, free, reserved, isolated, held (else
     `UnknownCPUs`; `Pending`, `NodeTopologyInvalid`, while the status reports none): the
     spec can be edited by whoever may write the object, the status is rewritten by the agent
     from its own machine on every heartbeat - and is not reserved for the system
     (`spec.reservedCPUs` or `status.reservedCPUs`, `ReservedCPUs`);
   - the pod has no other validated user-written binding (`DuplicateBinding`: one per pod);
   - what its exclusiveness level withholds (`allocation.levels.withheld_for` of its CPUs)
     overlaps nothing withheld by a binding of another pod on the node (`Conflict`, naming
     the other binding and the CPUs). Bindings of the same pod never conflict: the agent
     records every container it pins, also for a user-written binding, in a binding of its
     own on the same CPUs. The CPUs of a binding are its explicit ones (`spec.cpuSet` and
     `spec.containers[].cpuSet`), plus `status.cpus` once `Applied` (the agent's choice when
     the spec names none) and always for agent bindings. Who keeps the CPUs when two bindings
     clash: agent bindings first (and a binding still holding CPUs for a pod that is going
     away), then bindings already `Validated` or `Applied`, then the older
     (`creationTimestamp`), then by namespace/name - so a newcomer never unseats a binding
     that holds, and two validated bindings of different pods of a node never withhold a
     common CPU.
   The result goes to the status subresource: `phase` (`Validated`, `Failed` or `Pending`),
   `message`, `nodeName` and the condition `Validated` (True / False / Unknown with the reason
   above), plus an Event on the binding when the phase or the reason changes (Normal
   `Validated`, Warning with the failing reason, Normal for pending reasons). The agent owns
   the later phases: a valid binding it has `Applied`, or marked `Failed` after validation
   (condition `Validated` True), keeps its phase and message; a binding that cannot be decided
   now keeps `Validated`/`Applied` (only the condition turns Unknown). Bindings are checked
   again whenever their pod, another binding of their node, or the node's topology changes.
   **The agent** applies a user-written binding only in phase `Validated` and only when it
   fits the container's limits (checked again on the node: a status is not proof), and
   leaves the `Validated` condition alone.

2. **Deletes bindings whose pod is gone.** A binding belongs to one pod incarnation: the
   uid of its owner reference to the pod (`kind: Pod`, `apiVersion: v1`, the name
   `spec.podName`; `corepin.kube.models.pod_owner`). The agent sets it on the bindings it
   creates; the controller adds it to a user-written binding the first time it sees that
   binding's pod (adoption: an update with the resourceVersion read). A binding whose owner
   pod is gone, or whose pod name now belongs to another uid, is deleted (preconditions: the
   binding's uid and resourceVersion); the garbage collector usually gets there first, the
   controller covers the rest (a binding written after its pod went, a slow collector). The
   pod is read once more with a GET before deleting, so a lagging cache never deletes a
   fresh binding. A user-written binding whose pod never existed is not deleted: it stays
   `Failed` (`PodNotFound`) until the pod appears or someone removes it.

3. **Marks stale NodeCPUTopologies `Ready=False`** (reason `HeartbeatStale`) when the agent's
   `status.heartbeatTime` has not changed for `--heartbeat-timeout` seconds as observed by
   this controller (its own monotonic clock: the agent's and the controller's wall clocks
   are never compared, as leader election does with Leases). A topology seen for the first
   time gets the full timeout. It never sets `Ready=True` (the agent does, when it reports
   again), and leaves a `Ready=False` the agent wrote alone. The agent should advance
   `heartbeatTime` several times per timeout (e.g. every 10-20 s for the default 60 s).

4. **Keeps CPUReservations' time.** It writes `status.expireTime` (creation + `spec.ttl`) and
   `status.nodeName` (the spec's, when the status has none), turns a reservation whose TTL ran
   out `Expired` (its node's agent then gives the CPUs back), a Pending one whose
   `spec.nodeName` names no Node `Failed`, and deletes one its pod consumed under
   `allocateOnce` (phase `Succeeded`, written by the agent). Events: `ReservationExpired`,
   `ReservationFailed` (Warning), `ReservationConsumed`.

Every update carries the resourceVersion read; a 409 Conflict re-reads the object and applies
the decision again. Reads come from informers (list + watch), never a list per event.
"""
