"""The node agent's pure parts: reading pods (`plan.py`) and deciding (`sync.py`), with a
Hypothesis state machine over pod events: every moment, no CPU is held twice, reserved CPUs are
never handed out, the shared pool is never empty, and every running container that asked for
CPUs and could get them holds exactly what it asked."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from corepin.agent.node.sync import SyncContext, forget_pod, grow, shrink, sync_pod
from corepin.allocation.policies import get_policy
from corepin.core.cpuset import CPUSet
from corepin.kube.podplan import plan_pod, qos_class
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from support.budget import examples
from support.pods import container, pod

C = CPUSet.parse
TOPO = synthetic.named("dual_socket_ht")
POLICY = get_policy("topology-aware")


def cid(n: int) -> str:
    return f"{n:064x}"


# ---------------------------------------------------------------------- plan


@pytest.mark.parametrize(
    ("containers", "annotations", "policy", "count", "problem"),
    [
        ({"a": "2"}, {"corepin.io/cpu-policy": "exclusive"}, "exclusive", 2, ""),
        ({"a": "2"}, {"qos.gocrane.io/cpu-manager": "share"}, "share", 2, ""),
        (
            {"a": "2"},
            {"qos.gocrane.io/cpu-manager": "share", "corepin.io/cpu-policy": "exclusive"},
            "exclusive",
            2,
            "",
        ),
        ({"a": "1500m"}, {"corepin.io/cpu-policy": "exclusive"}, "none", 0, "1500m"),
        ({"a": None}, {"corepin.io/cpu-policy": "exclusive"}, "none", 0, "no CPU limit"),
        ({"a": "2"}, {"corepin.io/cpu-policy": "everything"}, "none", 0, "everything"),
        ({"a": "2"}, {}, "none", 0, ""),
        (
            {"a": "2"},
            {"corepin.io/cpu-policy": "exclusive", "corepin.io/cpu-policy.a": "none"},
            "none",
            0,
            "",
        ),
    ],
    ids=[
        "the corepin annotation asks for exclusive CPUs",
        "Crane's alias asks for share",
        "a corepin key wins over an alias",
        "a fractional request is ignored, naming the value",
        "no CPU limit is ignored with the reason",
        "an unknown policy value is refused, naming it",
        "no annotation means none",
        "a per-container key overrides the pod's",
    ],
)
def test_plans_follow_the_annotations_and_eligibility(
    containers: dict[str, str | None],
    annotations: dict[str, str],
    policy: str,
    count: int,
    problem: str,
) -> None:
    specs = [container(n, cpu, cpu) for n, cpu in containers.items()]
    plan = plan_pod(pod("p", *specs, annotations=annotations, running={"a": cid(1)}))
    [c] = plan.containers
    assert (c.policy, c.count) == (policy, count)
    assert problem in c.problem
    assert c.running and c.container_id == cid(1) and c.runtime == "containerd"


def test_a_container_id_with_path_characters_is_never_running() -> None:
    bad = pod("p", container("a", "1", "1"), running={"a": "../../etc"})
    [c] = plan_pod(bad).containers
    assert not c.running and c.container_id == "" and "../../etc" in c.bad_id
    _, notes = sync_pod(HostState.new(TOPO), plan_pod(bad), SyncContext(TOPO, POLICY))
    assert [n.reason for n in notes] == ["CPUPinFailed"] and "../../etc" in notes[0].message


def test_qos_classes_are_computed_as_kubernetes_does() -> None:
    guaranteed = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            ]
        }
    }
    burstable = {"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}}
    assert qos_class(guaranteed) == "guaranteed"
    assert qos_class(burstable) == "burstable"
    assert qos_class({"spec": {"containers": [{}]}}) == "besteffort"
    assert qos_class({"status": {"qosClass": "Burstable"}}) == "burstable"


# ---------------------------------------------------------------------- resize helpers


def test_grow_adds_cpus_next_to_the_kept_ones_and_shrink_keeps_the_cache() -> None:
    kept = C("0,16")
    added = grow(
        TOPO,
        kept,
        2,
        TOPO.online_cpus - kept,
        POLICY,
        plan_pod(pod("p", container("a", "4", "4"))).containers[0],
    )
    assert not added & kept and len(added) == 2
    assert TOPO.l3s_in(added) == TOPO.l3s_in(kept)
    spread = C("0,16,8,24,9")  # four CPUs in socket 0, one... all socket 0 here
    assert len(shrink(TOPO, spread, 2)) == 3


# ---------------------------------------------------------------------- the state machine


class PodEvents(RuleBasedStateMachine):
    """Pods come, start, restart, flip their policy, resize and go; the state stays sound."""

    def __init__(self) -> None:
        super().__init__()
        reserved = C("0,16")
        self.state = HostState.new(TOPO, reserved=reserved)
        self.pods: dict[str, dict[str, Any]] = {}
        self.counter = 0
        self.ctx = SyncContext(TOPO, POLICY)

    def _sync(self, name: str) -> None:
        self.state, _ = sync_pod(self.state, plan_pod(self.pods[name]), self.ctx)

    @rule(
        name=st.sampled_from(["a", "b", "c", "d", "e", "f"]),
        cpus=st.sampled_from(["1", "2", "4", "8", "500m", None]),
        policy=st.sampled_from(["none", "share", "exclusive"]),
        level=st.sampled_from(["cpu", "core", "numa"]),
    )
    def create_and_start(self, name: str, cpus: str | None, policy: str, level: str) -> None:
        if name in self.pods:
            return
        self.counter += 1
        annotations = {"corepin.io/cpu-policy": policy, "corepin.io/exclusiveness-level": level}
        self.pods[name] = pod(
            name,
            container("app", cpus, cpus),
            annotations=annotations,
            running={"app": cid(self.counter)},
        )
        self._sync(name)

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        self.counter += 1
        self.pods[name]["status"]["containerStatuses"][0]["containerID"] = (
            f"containerd://{cid(self.counter)}"
        )
        self._sync(name)

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data(), policy=st.sampled_from(["none", "share", "exclusive"]))
    def flip(self, data: st.DataObject, policy: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        self.pods[name]["metadata"]["annotations"]["corepin.io/cpu-policy"] = policy
        self._sync(name)

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data(), cpus=st.sampled_from(["1", "3", "6"]))
    def resize(self, data: st.DataObject, cpus: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        row = self.pods[name]["status"]["containerStatuses"][0]
        row["resources"] = {"limits": {"cpu": cpus}, "requests": {"cpu": cpus}}
        self._sync(name)

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        gone = self.pods.pop(name)
        self.state, _ = forget_pod(self.state, gone["metadata"]["uid"])

    @rule()
    def resync_everything(self) -> None:
        for name in sorted(self.pods):
            self._sync(name)

    @invariant()
    def no_cpu_is_held_twice_and_reserved_cpus_stay_free(self) -> None:
        assert self.state.overlaps() == []
        assert not self.state.held & self.state.reserved
        assert self.state.shared_pool, "the agent never empties the shared pool"

    @invariant()
    def every_running_container_has_an_assignment_of_the_right_kind(self) -> None:
        for p in self.pods.values():
            plan = plan_pod(p)
            for c in plan.containers:
                a = self.state.get(f"pod/{plan.uid}/{c.name}")
                assert a is not None, f"{plan.name} runs without an assignment"
                if c.policy == "none":
                    assert a.kind == "shared"
                elif a.kind != "shared":  # shared: CPUs were short (CPUPinFailed)
                    assert len(a.cpus) == c.count or a.kind == KIND[c.policy]


KIND = {"share": "share", "exclusive": "exclusive"}

TestPodEvents = PodEvents.TestCase
TestPodEvents.settings = settings(max_examples=examples(60), stateful_step_count=30)
