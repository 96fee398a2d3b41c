"""Builders shared by the webhook tests: AdmissionReviews, NodeCPUTopologies, and the
JSONPatch of an answer applied with the `jsonpatch` package (an RFC 6902 implementation that is
not ours)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch

from corepin.core.cpuset import CPUSet
from corepin.kube import models as m
from corepin.topology.model import Topology
from support.paths import PEER_FIXTURES

Obj = dict[str, Any]

ADMISSION_FIXTURE = PEER_FIXTURES / "admission_v1" / "admission.k8s.io.v1.AdmissionReview.json"
ADMISSION_FIXTURE_YAML = ADMISSION_FIXTURE.with_suffix(".yaml")
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
POD_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}


def review(
    obj: Obj | None,
    *,
    operation: str = "CREATE",
    old: Obj | None = None,
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
    namespace: str = "shop",
) -> Obj:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    request: Obj = {
        "uid": uid,
        "kind": dict(POD_KIND),
        "resource": dict(POD_RESOURCE),
        "requestKind": dict(POD_KIND),
        "requestResource": dict(POD_RESOURCE),
        "name": meta.get("name", "") if isinstance(meta, dict) else "",
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def patch_ops(answer: Obj) -> list[Obj]:
    response = answer["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[Obj] = json.loads(base64.b64decode(response["patch"], validate=True))
    return ops


def apply(obj: Obj, answer: Obj) -> Obj:
    """The pod after the answer's JSONPatch (the pod itself is left as it was)."""
    patched: Obj = jsonpatch.apply_patch(copy.deepcopy(obj), patch_ops(answer))
    return patched


def ncpt(
    name: str,
    topology: Topology,
    *,
    reserved: str = "",
    policy: str = "topology-aware",
    options: dict[str, str] | None = None,
) -> Obj:
    """A NodeCPUTopology as an agent publishes it (empty node, Ready)."""
    spec = m.NodeCPUTopologySpec(topology, policy, options or {}, CPUSet.parse(reserved))
    status = m.NodeCPUTopologyStatus(
        shared_pool=topology.online_cpus - topology.isolated_cpus,
        reserved_cpus=CPUSet.parse(reserved),
        free=topology.online_cpus - CPUSet.parse(reserved),
    )
    obj = m.NodeCPUTopology(m.ObjectMeta(name=name), spec, status).to_dict()
    return obj
