"""The node agent under a random stream of pod events and faults (Hypothesis state machine):
pods with every policy and level come, start, restart, flip their annotation and go; the agent
is killed and restarted, its watches dropped, the API's history compacted (410 Gone). After
each step settles: no CPU is in two exclusive containers' cgroups, every shared container runs
on exactly the shared pool, and every exclusive container holds what it asked for unless the
node is short (then it runs shared, with a CPUPinFailed Event)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from corepin.core.cpuset import CPUSet
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.testing import machines as synthetic
from support.budget import examples
from support.node_harness import FakeNode
from support.pods import container

TOPO = synthetic.named("single_socket_ht")  # 16 CPUs: shortage comes quickly


class AgentMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        from corepin.testing.fakeapi import FakeApiServer

        self.tmp = Path(tempfile.mkdtemp(prefix="corepin-agent-machine-"))
        self.api = FakeApiServer(bookmark_interval=0.5).start()
        kubeconfig = self.api.write_kubeconfig(self.tmp / "kubeconfig")
        self.client = KubeClient.from_config(load_config(kubeconfig, env={}), timeout=10)
        self.node = FakeNode(self.client, TOPO, self.tmp)
        self.agent = self.node.agent()
        self.pods: dict[str, dict[str, Any]] = {}
        self.count = 0

    def teardown(self) -> None:
        self.node.close()
        self.client.close()
        self.api.stop()

    def settle(self) -> None:
        """The agent has seen every pod as the API has it now (after dropped watches and a
        compaction its informers back off and relist first: it is idle meanwhile, without
        having looked at them) and has nothing left to do."""
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cache = self.agent.watches.pods.cache
            if all(
                (cache.get(p["metadata"]["name"], p["metadata"]["namespace"]) or {})
                .get("metadata", {})
                .get("resourceVersion")
                == self.node.get(p)["metadata"]["resourceVersion"]
                for p in self.pods.values()
            ):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the agent's pod informer did not catch up within 30 s")
        assert self.agent.wait_idle(30), "the agent did not settle"

    @rule(
        cpus=st.sampled_from(["1", "2", "3", "500m", None]),
        policy=st.sampled_from(["none", "share", "exclusive"]),
        level=st.sampled_from(["cpu", "core", "l3"]),
    )
    def create(self, cpus: str | None, policy: str, level: str) -> None:
        self.count += 1
        name = f"p{self.count}"
        annotations = {"corepin.io/cpu-policy": policy, "corepin.io/exclusiveness-level": level}
        app = container("app", cpus, memory="64Mi") if cpus else container("app")
        pod = self.node.pod(name, app, annotations=annotations)
        self.pods[name] = self.node.run(pod)
        self.settle()

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data())
    def restart_container(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        self.node.restart(self.pods[name], "app")
        self.settle()

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data(), policy=st.sampled_from(["none", "share", "exclusive"]))
    def flip(self, data: st.DataObject, policy: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        self.node.annotate(self.pods[name], {"corepin.io/cpu-policy": policy})
        self.settle()

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        self.node.delete(self.pods.pop(name))
        self.settle()

    @rule()
    def kill_and_restart_the_agent(self) -> None:
        self.agent.stop(timeout=2)
        self.agent = self.node.agent()
        self.settle()

    @rule()
    def drop_watches_and_compact(self) -> None:
        self.api.drop_watches()
        self.api.compact()
        self.settle()

    def problems(self) -> list[str]:
        """What is wrong right now (empty: the cgroups are sound)."""
        state = self.agent.state
        if state is None:
            return ["no state yet"]
        out = [f"overlap {o}" for o in state.overlaps()]
        exclusive = CPUSet()
        for name, pod in self.pods.items():
            cpus = self.node.cpus(pod, "app")
            a = state.get(f"pod/{pod['metadata']['uid']}/app")
            if a is None:
                out.append(f"{name} runs without an assignment")
            elif a.kind == "exclusive":
                if cpus & exclusive:
                    out.append(f"{name}: CPUs {cpus & exclusive} in two exclusive containers")
                exclusive = exclusive | cpus
                if cpus != a.cpus:
                    out.append(f"{name}: cgroup {cpus}, assignment {a.cpus}")
            elif a.kind == "shared" and cpus != state.shared_pool:
                out.append(f"{name}: cgroup {cpus}, shared pool {state.shared_pool}")
        if exclusive & state.shared_pool:
            out.append(f"exclusive CPUs {exclusive & state.shared_pool} in the shared pool")
        return out

    @invariant()
    def cgroups_are_sound(self) -> None:
        """Eventually (the agent hears of a change through its watch, which may be down for a
        backoff after a fault): every problem goes away and none is made permanent."""
        if not self.pods:
            return
        deadline = time.monotonic() + 30
        while True:
            self.settle()
            found = self.problems()
            if not found or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert found == []


TestAgentMachine = AgentMachine.TestCase
TestAgentMachine.settings = settings(max_examples=examples(4), stateful_step_count=10)
