"""Pods and containers as the tests write them, built in one place.

`pod(name, *containers, ...)` is a Pod as a client sends it to the API server (apiVersion, kind,
metadata, spec) or as an agent reads it back: with `running`, its containers have statuses and
container ids. Every pod gets a uid derived from its namespace and name, so that building the
same pod twice gives the same pod (the API server replaces it with its own on create).

`container(name, cpu, request, ...)` is one container: `cpu` is its CPU limit and `request` its
CPU request. A request that is not given is not written: the API server defaults it to the
limit, and so does corepin's reading of a pod that did not pass an API server, so a container
with limits alone is Guaranteed when it also has a memory limit.

`corepin_annotations(...)` are the annotations by which a pod asks corepin for CPUs.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Collection, Mapping
from typing import Any

Obj = dict[str, Any]

#: The image of every container (the kubelet harness runs busybox whatever the name says).
IMAGE = "busybox:1.36"
#: A pod's annotation asking for exclusive CPUs.
EXCLUSIVE = {"corepin.io/cpu-policy": "exclusive"}

_container_ids = itertools.count(1)


def container(
    name: str = "app",
    cpu: str | int | None = None,
    request: str | int | None = None,
    *,
    memory: str | None = None,
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    image: str = IMAGE,
    **fields: Any,
) -> Obj:
    """A container spec. `cpu` and `memory` are its limits, `request` its CPU request;
    `requests` and `limits` add any other resource (a memory request, an extended resource).
    `resources` is left out when nothing is set; `fields` are further fields as the API spells
    them (command, env, volumeMounts...)."""
    wanted_limits: Obj = {}
    if cpu is not None:
        wanted_limits["cpu"] = cpu
    if memory is not None:
        wanted_limits["memory"] = memory
    wanted_limits.update(limits or {})
    wanted_requests: Obj = {} if request is None else {"cpu": request}
    wanted_requests.update(requests or {})
    spec: Obj = {"name": name, "image": image}
    resources: Obj = {}
    if wanted_limits:
        resources["limits"] = wanted_limits
    if wanted_requests:
        resources["requests"] = wanted_requests
    if resources:
        spec["resources"] = resources
    spec.update(fields)
    return spec


def pod(
    name: str,
    *containers: Obj,
    namespace: str = "default",
    uid: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    node: str | None = None,
    scheduler: str | None = None,
    running: bool | Mapping[str, str] = False,
    terminated: Collection[str] = (),
    **spec: Any,
) -> Obj:
    """A Pod of `containers` (default: one container named app, without resources).

    `uid`: default derived from namespace and name. `annotations`, `labels`: written when
    given (also when empty). `node` is spec.nodeName, `scheduler` spec.schedulerName, `spec`
    further spec fields as the API spells them. `running`: True gives every container a
    running status with a fresh containerd id, a mapping gives the containers it names the
    ids it maps them to; those in `terminated` ran and exited."""
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid
        if uid is not None
        else str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{namespace}/{name}")),
    }
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if labels is not None:
        meta["labels"] = dict(labels)
    body: Obj = {"containers": list(containers) or [container()]}
    if node is not None:
        body["nodeName"] = node
    if scheduler is not None:
        body["schedulerName"] = scheduler
    body.update(spec)
    obj: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}
    if running is not False:
        obj["status"] = {"containerStatuses": _statuses(body["containers"], running, terminated)}
    return obj


def running_container(name: str, cid: str, *, restarts: int = 0) -> Obj:
    """A container status as a kubelet reports a running container with containerd id `cid`."""
    return {
        "name": name,
        "containerID": f"containerd://{cid}",
        "state": {"running": {"startedAt": "2026-11-22T00:00:00Z"}},
        "ready": True,
        "started": True,
        "restartCount": restarts,
        "image": "busybox",
        "imageID": "busybox",
    }


def _statuses(
    containers: list[Obj], running: bool | Mapping[str, str], terminated: Collection[str]
) -> list[Obj]:
    ids = (
        {c["name"]: f"{next(_container_ids):064x}" for c in containers}
        if running is True
        else dict(running)  # type: ignore[arg-type]
    )
    out = []
    for cname, cid in ids.items():
        state = {"terminated": {"exitCode": 0}} if cname in terminated else {"running": {}}
        out.append({"name": cname, "containerID": f"containerd://{cid}", "state": state})
    return out


def corepin_annotations(
    policy: str | None = "exclusive", *, level: str | None = None, workload: str | None = None
) -> dict[str, str]:
    """The annotations of a pod asking corepin for CPUs: its CPU policy, exclusiveness level
    and workload type (None: not given)."""
    notes: dict[str, str] = {}
    if policy is not None:
        notes["corepin.io/cpu-policy"] = policy
    if level is not None:
        notes["corepin.io/exclusiveness-level"] = level
    if workload is not None:
        notes["corepin.io/workload-type"] = workload
    return notes
