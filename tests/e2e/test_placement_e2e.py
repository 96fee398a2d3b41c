"""Admission and placement end to end, the way a cluster with kube-scheduler does it: the real
`corepin webhook` process (HTTPS, a certificate made at test time, the capacity rule fed by the
agents' NodeCPUTopologies through the fake API server), the real extender HTTP server in
process, three nodes each with a real node agent (its own synthetic topology and fake cgroup
tree, `e2e_cluster`), a fourth node without an agent, and two stand-ins:

- an API server's admission chain: every pod is POSTed as an AdmissionReview v1 to /mutate, the
  returned JSONPatch is applied, then to /validate; a refused pod is not created;
- a kube-scheduler that uses nothing but the extender's verbs (`nodeCacheCapable`): /filter
  with the node names, /prioritize over the passing ones, the best score wins, /bind; a pod
  that passes nowhere stays Pending with the filter's reasons.

The kubelet stand-in of `e2e_cluster` starts what is bound. What is checked is read back from
the nodes' cgroups and the agents' assignment files, not only from the API."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from corepin.allocation.levels import units_of
from corepin.core.cpuset import CPUSet
from corepin.core.errors import ApiNotFound
from corepin.kube.client import KubeClient
from corepin.kube.models import parse_cpus_annotation
from corepin.kube.resources import EVENTS, NODES, PODS
from corepin.testing.fakeapi import TLSMaterial
from support.e2e_cluster import TOPOLOGIES, Kubelets, cluster, workload
from support.extender_harness import Extender
from support.helpers import wait_for
from support.node_harness import FakeNode
from support.pods import container, corepin_annotations, pod
from support.webhook_helpers import review
from support.webhook_process import WebhookProcess

Obj = dict[str, Any]
NAMESPACE = "default"
NO_AGENT = "node-d"  # a Node whose agent never published a NodeCPUTopology
NODE_NAMES = [*TOPOLOGIES, NO_AGENT]
WORKLOAD_PODS = 50


# ---------------------------------------------------------------------- the pods
#: Pods the webhook must refuse, with the words the refusal must contain to be actionable
#: (what is wrong with which container, and what to do about it).
BAD = {
    "fractional": (
        pod(
            "fractional",
            container("c0", "1500m", memory="64Mi"),
            annotations=corepin_annotations(level="cpu"),
        ),
        ["container 'c0'", "whole number", "corepin.io/cpu-policy.c0: none"],
    ),
    "request-not-limit": (
        pod(
            "request-not-limit",
            container("c0", "2", "1", memory="64Mi"),
            annotations=corepin_annotations(level="cpu"),
        ),
        ["container 'c0'", "equal to it", "corepin.io/cpu-policy.c0: none"],
    ),
}

#: Created after the 50, which leave node-c's second NUMA node empty: the first takes it; the
#: others pass the webhook (an empty node-c could hold each) but no node can hold them then,
#: so they must stay Pending - late-numa-2 right after late-numa-1 was bound, before node-c's
#: agent may have published it (the extender counts placements, its own and the bound pods
#: its informer sees, until the node shows them).
LATE = [
    pod(
        "late-numa-1",
        container("c0", "40", memory="64Mi"),
        annotations=corepin_annotations(level="numa"),
    ),
    pod(
        "late-numa-2",
        container("c0", "40", memory="64Mi"),
        annotations=corepin_annotations(level="numa"),
    ),
    pod(
        "late-big",
        container("c0", "127", memory="64Mi"),
        annotations=corepin_annotations(level="cpu"),
    ),
    pod(
        "late-pair",
        container("c0", "100", memory="64Mi"),
        container("c1", "27", memory="64Mi"),
        annotations=corepin_annotations(level="cpu"),
    ),
]
PENDING = ["late-big", "late-numa-2", "late-pair"]


def _workload_pods() -> list[tuple[Obj, list[str] | None]]:
    """The 50 pods of the scheduler's end-to-end test, for kube-scheduler (no schedulerName);
    those no node can ever hold come with the words their refusal must contain."""
    out: list[tuple[Obj, list[str] | None]] = []
    for i in range(WORKLOAD_PODS):
        body, fits = workload(i, scheduler=None)
        if fits:
            out.append((body, None))
        elif body["metadata"]["annotations"]["corepin.io/exclusiveness-level"] == "socket":
            out.append((body, ["container 'c0'", "at exclusiveness level socket", "narrower"]))
        else:  # 200 CPUs: node-c, the biggest, can give 127 (one stays in the shared pool)
            out.append((body, ["container 'c0' asks for 200", "node-c", "ask for at most 127"]))
    return out


# ---------------------------------------------------------------------- API server stand-in
class Admission:
    """The API server's side of the admission webhooks: mutate, apply the patch, validate."""

    def __init__(self, webhook: WebhookProcess) -> None:
        self.webhook = webhook
        self.count = 0

    def _review(self, path: str, pod: Obj) -> Obj:
        self.count += 1
        uid = f"00000000-0000-4000-8000-{self.count:012d}"
        answer = self.webhook.post(path, review(pod, uid=uid, namespace=NAMESPACE))
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        response: Obj = answer["response"]
        assert response["uid"] == uid
        return response

    def admit(self, pod: Obj) -> tuple[Obj | None, str]:
        """The pod as it would be stored (None: refused) and the refusal's message."""
        mutated = self._review("/mutate", pod)
        assert mutated["allowed"] is True  # mutate never refuses
        if "patch" in mutated:
            assert mutated["patchType"] == "JSONPatch"
            ops = json.loads(base64.b64decode(mutated["patch"], validate=True))
            pod = jsonpatch.apply_patch(copy.deepcopy(pod), ops)
        validated = self._review("/validate", pod)
        if validated["allowed"]:
            return pod, ""
        message: str = validated["status"]["message"]
        assert validated["status"]["code"] in (400, 403, 422), validated
        return None, message


# ---------------------------------------------------------------------- kube-scheduler stand-in
class KubeScheduler:
    """Places every pending pod (in the order they were created) using only the extender's
    HTTP verbs, as kube-scheduler with `nodeCacheCapable: true`, filter, prioritize and bind
    verbs does. A pod that passes no node is remembered with the filter's answer and left
    Pending (kube-scheduler would retry it later: `retry()`)."""

    def __init__(self, kube: KubeClient, port: int) -> None:
        self.kube = kube
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.tried: set[str] = set()
        self.bound: dict[str, str] = {}  # pod -> node
        self.pending: dict[str, Obj] = {}  # pod -> the last filter answer
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> KubeScheduler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.conn.close()

    def _post(self, verb: str, payload: Obj) -> Any:
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        try:
            self.conn.request("POST", f"/{verb}", body=body, headers=headers)
            answer = self.conn.getresponse()
        except ConnectionError:  # BrokenPipe, reset, RemoteDisconnected
            # the extender closes a keep-alive connection idle for its timeout: a client
            # (kube-scheduler's too) opens a new one
            self.conn.close()
            self.conn.request("POST", f"/{verb}", body=body, headers=headers)
            answer = self.conn.getresponse()
        body = answer.read()
        assert answer.status == 200, (verb, answer.status, body)
        return json.loads(body)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            items = self.kube.list(PODS, NAMESPACE)["items"]
            waiting = [
                p
                for p in items
                if not p["spec"].get("nodeName") and p["metadata"]["uid"] not in self.tried
            ]
            waiting.sort(key=lambda p: int(p["metadata"]["resourceVersion"]))
            for p in waiting:
                try:
                    self.schedule(p)
                except Exception as exc:  # reported by the test, not lost in the thread
                    self.errors.append(f"{p['metadata']['name']}: {exc!r}")
                self.tried.add(p["metadata"]["uid"])

    def schedule(self, pod: Obj) -> str | None:
        name = pod["metadata"]["name"]
        args = {"Pod": pod, "Nodes": None, "NodeNames": list(NODE_NAMES)}
        filtered = self._post("filter", args)
        assert filtered["Error"] == "" and filtered["Nodes"] is None, filtered
        passing: list[str] = filtered["NodeNames"] or []
        if not passing:
            self.pending[name] = filtered
            return None
        scores = self._post("prioritize", {**args, "NodeNames": passing})
        assert {row["Host"] for row in scores} == set(passing), scores
        assert all(0 <= row["Score"] <= 10 for row in scores), scores
        best = max(scores, key=lambda row: row["Score"])["Host"]  # ties: the first listed
        bound = self._post(
            "bind",
            {
                "PodName": name,
                "PodNamespace": NAMESPACE,
                "PodUID": pod["metadata"]["uid"],
                "Node": best,
            },
        )
        assert bound == {"Error": ""}, (name, best, bound)
        self.bound[name] = best
        self.pending.pop(name, None)
        return str(best)

    def retry(self) -> None:
        """Every pod still Pending goes through the verbs once more."""
        for name in sorted(self.pending):
            self.schedule(self.kube.get(PODS, name, NAMESPACE))


# ---------------------------------------------------------------------- the test
def _running(p: Obj) -> bool:
    """Bound, its containers started, and pinned when it asks for CPUs of its own."""
    statuses = (p.get("status") or {}).get("containerStatuses") or []
    annotations = p["metadata"].get("annotations") or {}
    pinned = parse_cpus_annotation(annotations.get("corepin.io/cpus") or "{}")
    own = [c for c in p["spec"]["containers"] if _policy(p, c["name"]) != "none"]
    return len(statuses) == len(p["spec"]["containers"]) and len(pinned) == len(own)


def _policy(p: Obj, name: str) -> str:
    annotations = p["metadata"].get("annotations") or {}
    key = f"corepin.io/cpu-policy.{name}"
    return str(annotations.get(key) or annotations.get("corepin.io/cpu-policy") or "none")


@pytest.mark.slow
def test_admitted_pods_placed_by_the_extender_end_pinned_and_the_rest_stay_pending_or_refused(
    kube: KubeClient, fake_kubeconfig: Path, tls_material: TLSMaterial, tmp_path: Path
) -> None:
    started = time.monotonic()
    with cluster(kube, tmp_path) as nodes, Kubelets(kube, nodes):
        kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NO_AGENT}})
        webhook = WebhookProcess(tls_material, "--kubeconfig", str(fake_kubeconfig))
        try:
            wait_for(
                lambda: "corepin_webhook_node_topologies 3.0" in webhook.metrics(),
                timeout=30,
                what="the webhook to see the three NodeCPUTopologies",
            )
            with Extender(kube) as extender:
                extender.wait_nodes(*TOPOLOGIES)
                with KubeScheduler(kube, extender.server.port) as scheduler:
                    admitted, refused = _admit_and_create(kube, Admission(webhook))
                    _settle(kube, nodes, scheduler, admitted)
                    scheduler.retry()  # once the agents have published everything
                    assert not scheduler.errors, scheduler.errors
                    _check(kube, nodes, scheduler, admitted, refused)
        finally:
            webhook.kill()
    print(f"\nplacement e2e: {time.monotonic() - started:.1f} s")


def _admit_and_create(kube: KubeClient, admission: Admission) -> tuple[list[str], dict[str, str]]:
    """Every pod through the webhook, then created when it was allowed (interleaved with the
    scheduler and the kubelets, as in a cluster). The names admitted, and the refusals."""
    pods = _workload_pods()
    pods.insert(12, BAD["fractional"])
    pods.insert(30, BAD["request-not-limit"])
    pods += [(p, None) for p in LATE]
    admitted: list[str] = []
    refused: dict[str, str] = {}
    for body, refusal in pods:
        name = body["metadata"]["name"]
        stored, message = admission.admit(body)
        if refusal is not None:
            assert stored is None, f"the webhook let {name} through"
            missing = [words for words in refusal if words not in message]
            assert not missing, f"{name}: the refusal {message!r} does not say {missing}"
            refused[name] = message
            continue
        assert stored is not None, f"the webhook refused {name}: {message}"
        kube.create(PODS, stored, NAMESPACE)
        admitted.append(name)
    return admitted, refused


def _settle(
    kube: KubeClient, nodes: dict[str, FakeNode], scheduler: KubeScheduler, admitted: list[str]
) -> None:
    def settled() -> bool:
        if scheduler.errors:
            return True  # reported by the caller
        if len(scheduler.bound) + len(scheduler.pending) < len(admitted):
            return False
        pods = kube.list(PODS, NAMESPACE)["items"]
        return all(_running(p) for p in pods if p["spec"].get("nodeName"))

    def refused_by_an_agent() -> bool:
        events = kube.list(EVENTS, NAMESPACE)["items"]
        return any(e["reason"] == "CPUPinFailed" for e in events)

    try:
        # an agent that cannot pin what the extender placed: over-booked, no use waiting
        wait_for(
            lambda: settled() or refused_by_an_agent(),
            timeout=60,
            what="every admitted pod to be placed and pinned or pending",
        )
        assert not refused_by_an_agent()
    except AssertionError:
        pods = kube.list(PODS, NAMESPACE)["items"]
        stuck = [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in pods]
        warnings = [
            (e["involvedObject"]["name"], e["reason"], e["message"])
            for e in kube.list(EVENTS, NAMESPACE)["items"]
            if e["type"] == "Warning"
        ]
        raise AssertionError((scheduler.errors, stuck, warnings)) from None
    for node in nodes.values():
        assert node.agents[0].wait_idle(30)


def _check_mutated(p: Obj) -> None:
    """What the mutating webhook adds is on the stored pod: COREPIN_NUM_CPUS on each container
    with CPUs of its own (nothing on the others), the assignment directory's volume."""
    wants_cpus = False
    for c in p["spec"]["containers"]:
        env = {e["name"]: e for e in c.get("env") or []}
        if _policy(p, c["name"]) == "none":
            assert not env and not c.get("volumeMounts"), (p["metadata"]["name"], c)
            continue
        wants_cpus = True
        assert env["COREPIN_NUM_CPUS"]["value"] == c["resources"]["limits"]["cpu"], c
    volumes = {v["name"]: v for v in p["spec"].get("volumes") or []}
    if wants_cpus:
        assert volumes["corepin-assignments"]["hostPath"]["path"] == "/run/corepin/assignments"
    else:
        assert not volumes, p["spec"]


def _assignment_file(node: FakeNode, name: str, c: Obj) -> dict[str, str]:
    """The agent's file for the container, found through the webhook's environment."""
    env = {e["name"]: e for e in c.get("env") or []}
    assert env["COREPIN_POD_NAME"]["valueFrom"] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}
    }
    path = env["COREPIN_ASSIGNMENT_FILE"]["value"].replace("$(COREPIN_POD_NAME)", name)
    assert path == f"/etc/corepin/{NAMESPACE}.{name}.{c['name']}"
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or []}
    assert mounts["/etc/corepin"]["readOnly"] is True
    assert mounts["/etc/corepin"]["name"] == "corepin-assignments"
    # /etc/corepin in the container is the agent's --assignment-dir on the node
    text = (Path(node.settings().assignment_dir) / Path(path).name).read_text()
    return dict(line.split("=", 1) for line in text.splitlines())


def _check(
    kube: KubeClient,
    nodes: dict[str, FakeNode],
    scheduler: KubeScheduler,
    admitted: list[str],
    refused: dict[str, str],
) -> None:
    pods = {p["metadata"]["name"]: p for p in kube.list(PODS, NAMESPACE)["items"]}
    # refused pods were never created; every admitted one was
    assert sorted(pods) == sorted(admitted)
    assert len(refused) == 6 and len(admitted) == WORKLOAD_PODS - 4 + len(LATE)
    for name in refused:
        with pytest.raises(ApiNotFound):
            kube.get(PODS, name, NAMESPACE)

    # Per node, from the cgroups: every container's CPUs and what each hold withholds.
    holds: dict[str, list[tuple[str, str, CPUSet, CPUSet]]] = {n: [] for n in nodes}
    pool_users: dict[str, list[tuple[str, CPUSet]]] = {n: [] for n in nodes}
    for name in admitted:
        p = pods[name]
        _check_mutated(p)
        node = p["spec"].get("nodeName")
        if name in scheduler.pending:
            assert node is None, f"{name} passed no filter but is on {node}"
            continue
        assert node == scheduler.bound[name], f"{name}: bound by the extender to {node}"
        fake = nodes[node]
        annotations = p["metadata"]["annotations"]
        level = annotations.get("corepin.io/exclusiveness-level", "cpu")
        pinned = parse_cpus_annotation(annotations.get("corepin.io/cpus") or "{}")
        units = units_of(fake.topology, level)
        for c in p["spec"]["containers"]:
            who = f"{name}/{c['name']}"
            policy = _policy(p, c["name"])
            cpus = fake.cpus(p, c["name"])  # what the agent wrote into the container's cgroup
            if policy == "none":
                assert c["name"] not in pinned, who
                assert cpus, f"{who}: an empty cpuset"
                pool_users[node].append((who, cpus))
                continue
            want = int(c["resources"]["limits"]["cpu"])
            assert cpus == pinned[c["name"]] and len(cpus) == want, (who, cpus, pinned)
            written = _assignment_file(fake, name, c)
            assert CPUSet.parse(written["COREPIN_CPUS"]) == cpus, (who, written)
            assert written["COREPIN_POLICY"] == policy, (who, written)
            withheld = CPUSet()
            for unit in units:
                if unit & cpus:
                    withheld |= unit
            holds[node].append((who, policy, cpus, withheld))

    # Nothing over-booked: no CPU held by two containers, no container inside another's
    # withheld units, no shared-pool container on an exclusive CPU, the shared pool never empty.
    for node, rows in holds.items():
        for i, (who, _policy_of, cpus, withheld) in enumerate(rows):
            for other, _other_policy, other_cpus, other_withheld in rows[i + 1 :]:
                assert not cpus & other_withheld, f"{node}: {who} {cpus} in {other}'s units"
                assert not other_cpus & withheld, f"{node}: {other} {other_cpus} in {who}'s units"
        exclusive = CPUSet()
        for _who, policy, _cpus, withheld in rows:
            if policy == "exclusive":
                exclusive |= withheld
        pool = nodes[node].topology.online_cpus - exclusive  # nothing reserved or isolated
        assert pool, f"{node}: nothing left for the shared pool"
        for who, cpus in pool_users[node]:
            assert cpus == pool, f"{node}: {who} runs on {cpus}, the shared pool is {pool}"

    # The pods that passed no filter: each node said why, and the cgroups agree it cannot fit.
    assert sorted(scheduler.pending) == PENDING
    for name, answer in scheduler.pending.items():
        p = pods[name]
        asked = sum(int(c["resources"]["limits"]["cpu"]) for c in p["spec"]["containers"])
        level = p["metadata"]["annotations"]["corepin.io/exclusiveness-level"]
        assert answer["NodeNames"] == [], answer
        assert "no NodeCPUTopology" in answer["FailedAndUnresolvableNodes"][NO_AGENT], answer
        assert sorted(answer["FailedNodes"]) == sorted(TOPOLOGIES), answer
        for node, reason in answer["FailedNodes"].items():
            assert "container 'c0' asks for" in reason and "exclusive CPU(s)" in reason, reason
            in_use = CPUSet()
            for _who, _policy_of, _cpus, withheld in holds[node]:
                in_use |= withheld
            # at most every CPU of the units at its level that nothing holds (an upper bound:
            # the shared pool keeps one CPU on top)
            units = units_of(nodes[node].topology, level)
            room = sum(len(unit) for unit in units if not unit & in_use)
            assert asked > room, f"{name} asks {asked}, {node} has room for {room}: {reason}"
    events = kube.list(EVENTS, NAMESPACE)["items"]
    failed = [
        (e["involvedObject"]["name"], e["message"]) for e in events if e["reason"] == "CPUPinFailed"
    ]
    assert not failed, f"an agent could not pin what the extender placed: {failed}"
