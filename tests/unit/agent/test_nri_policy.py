"""The NRI plugin's decisions (`corepin.agent.node.nri.policy.NriPolicy`), driven with NRI
messages as the runtime sends them, on a real checkpoint in a temp dir (no socket: the wire is
tested in tests/unit/nri, the whole plugin against a real containerd in tests/e2e)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corepin.agent.node.nri.policy import NO_QUOTA, NriPolicy
from corepin.agent.node.nri.qos import RdtClasses
from corepin.agent.node.nri.settings import NriSettings
from corepin.agent.node.nri.view import ANN_CPU_LIMIT, RuntimeView, qos_of_parent
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.core.record import replace
from corepin.kube.podplan import plan_pod
from corepin.nri.gen import api_pb2 as nri
from corepin.testing.machines import single_socket_ht
from support.budget import examples
from support.resctrl_tree import make_resctrl_tree

POLICY = "corepin.io/cpu-policy"


def sandbox(n: int, policy: str = "") -> nri.PodSandbox:
    pod = nri.PodSandbox(
        id=f"sandbox{n}",
        name=f"pod{n}",
        namespace="default",
        uid=f"uid-{n}",
        linux=nri.LinuxPodSandbox(cgroup_parent=f"/kubepods/poduid-{n}"),
    )
    if policy:
        pod.annotations[POLICY] = policy
    return pod


def container(n: int, pod: int, milli: int, *, name: str = "app") -> nri.Container:
    """A container as the kubelet asks for `milli` millicores (request = limit)."""
    c = nri.Container(
        id=f"{n:064x}", pod_sandbox_id=f"sandbox{pod}", name=name, state=nri.CONTAINER_CREATED
    )
    c.linux.resources.cpu.quota.value = milli * 100
    c.linux.resources.cpu.period.value = 100000
    c.linux.resources.cpu.shares.value = milli * 1024 // 1000
    return c


@pytest.fixture
def policy(tmp_path: Path) -> Iterator[NriPolicy]:
    p = NriPolicy(NriSettings(node_name="node1", state_dir=str(tmp_path)), single_socket_ht())
    p.synchronize([], [])
    yield p


def cpus_of(cpu: nri.LinuxCPU) -> CPUSet:
    return CPUSet.parse(cpu.cpus)


def create(p: NriPolicy, pod: nri.PodSandbox, c: nri.Container) -> nri.CreateContainerResponse:
    return p.create_container(nri.CreateContainerRequest(pod=pod, container=c))


def started(p: NriPolicy, pod: nri.PodSandbox, c: nri.Container) -> None:
    """The runtime started the container (its PostStartContainer event)."""
    p.state_change(nri.StateChangeEvent(event=nri.POST_START_CONTAINER, pod=pod, container=c))


def test_exclusive_container_is_pinned_in_the_create_reply_and_shared_ones_shrink(
    policy: NriPolicy,
) -> None:
    shared = create(policy, sandbox(1), container(1, 1, 500))
    assert cpus_of(shared.adjust.linux.resources.cpu) == CPUSet.parse("0-15")
    assert not shared.adjust.linux.resources.cpu.HasField("quota")

    reply = create(policy, sandbox(2, "exclusive"), container(2, 2, 2000))
    mine = cpus_of(reply.adjust.linux.resources.cpu)
    assert len(mine) == 2
    assert reply.adjust.linux.resources.cpu.quota.value == NO_QUOTA
    assert reply.adjust.annotations[ANN_CPU_LIMIT] == "200000/100000"
    (update,) = reply.update
    assert update.container_id == f"{1:064x}"
    assert cpus_of(update.linux.resources.cpu) == CPUSet.parse("0-15") - mine
    assert update.linux.resources.cpu.mems == "0"


def test_ineligible_container_marked_exclusive_runs_on_the_shared_pool(policy: NriPolicy) -> None:
    create(policy, sandbox(1, "exclusive"), container(1, 1, 2000))
    reply = create(policy, sandbox(2, "exclusive"), container(2, 2, 500))
    cpu = reply.adjust.linux.resources.cpu
    assert cpus_of(cpu) == policy.state.shared_pool if policy.state else False
    assert len(cpus_of(cpu)) == 14
    assert not cpu.HasField("quota")
    assert not reply.update


def test_update_container_reasserts_the_pin(policy: NriPolicy) -> None:
    pod = sandbox(1, "exclusive")
    mine = cpus_of(create(policy, pod, container(1, 1, 2000)).adjust.linux.resources.cpu)
    asked = nri.UpdateContainerRequest(pod=pod, container=container(1, 1, 2000))
    asked.linux_resources.cpu.cpus = "0-15"
    asked.linux_resources.cpu.quota.value = 200000
    reply = policy.update_container(asked)
    (update,) = reply.update
    assert update.container_id == f"{1:064x}"
    assert cpus_of(update.linux.resources.cpu) == mine
    assert update.linux.resources.cpu.quota.value == NO_QUOTA


def test_in_place_resize_grows_around_the_kept_cpus(policy: NriPolicy) -> None:
    pod = sandbox(1, "exclusive")
    before = cpus_of(create(policy, pod, container(1, 1, 2000)).adjust.linux.resources.cpu)
    asked = nri.UpdateContainerRequest(pod=pod, container=container(1, 1, 2000))
    asked.linux_resources.cpu.quota.value = 400000
    asked.linux_resources.cpu.period.value = 100000
    asked.linux_resources.cpu.shares.value = 4096
    after = cpus_of(policy.update_container(asked).update[0].linux.resources.cpu)
    assert len(after) == 4 and before <= after


def test_stop_releases_and_the_shared_pool_grows_back(policy: NriPolicy) -> None:
    create(policy, sandbox(1), container(1, 1, 500))
    create(policy, sandbox(2, "exclusive"), container(2, 2, 2000))
    reply = policy.stop_container(
        nri.StopContainerRequest(pod=sandbox(2, "exclusive"), container=container(2, 2, 2000))
    )
    (update,) = reply.update
    assert cpus_of(update.linux.resources.cpu) == CPUSet.parse("0-15")
    assert policy.state is not None and not policy.state.exclusive_cpus


def test_a_removed_pod_is_released_and_the_next_reply_carries_the_updates(
    policy: NriPolicy,
) -> None:
    create(policy, sandbox(1), container(1, 1, 500))
    started(policy, sandbox(1), container(1, 1, 500))
    create(policy, sandbox(2, "exclusive"), container(2, 2, 2000))
    # removed without its container being stopped first: no reply to carry the growth now
    policy.state_change(nri.StateChangeEvent(event=nri.REMOVE_POD_SANDBOX, pod=sandbox(2)))
    assert policy.state is not None and not policy.state.exclusive_cpus
    reply = create(policy, sandbox(3), container(3, 3, 500))
    (update,) = reply.update
    assert update.container_id == f"{1:064x}"
    assert cpus_of(update.linux.resources.cpu) == CPUSet.parse("0-15")


def test_a_container_updated_before_it_ran_is_updated_again_once_it_runs(
    policy: NriPolicy,
) -> None:
    shared, quiet = container(1, 1, 500), container(3, 3, 500)
    create(policy, sandbox(1), shared)  # created on every CPU, not started yet...
    create(policy, sandbox(3), quiet)
    started(policy, sandbox(3), quiet)
    reply = create(policy, sandbox(2, "exclusive"), container(2, 2, 2000))
    mine = cpus_of(reply.adjust.linux.resources.cpu)
    # ...narrowed in this reply: the runtime may have changed only its spec
    assert {u.container_id for u in reply.update} == {shared.id, quiet.id}
    shared.linux.resources.cpu.cpus = str(CPUSet.parse("0-15") - mine)  # (the spec)
    shared.linux.resources.cpu.mems = "0"
    started(policy, sandbox(1), shared)
    # the next reply sends it again, now that it runs; the running one is not sent twice
    again = create(policy, sandbox(4), container(4, 4, 500))
    (update,) = again.update
    assert update.container_id == shared.id
    assert cpus_of(update.linux.resources.cpu) == CPUSet.parse("0-15") - mine
    assert not create(policy, sandbox(5), container(5, 5, 500)).update


def test_a_waiting_container_is_upgraded_when_cpus_free_up(tmp_path: Path) -> None:
    p = NriPolicy(
        NriSettings(
            node_name="node1",
            state_dir=str(tmp_path),
            reserved_cpus=CPUSet.parse("0-7"),
            options={"strict-cpu-reservation": "true"},  # the reserved CPUs leave the pool
        ),
        single_socket_ht(),
    )
    p.synchronize([], [])
    create(p, sandbox(1, "exclusive"), container(1, 1, 6000))
    reply = create(
        p, sandbox(2, "exclusive"), container(2, 2, 2000)
    )  # 2 left, the whole pool: refused
    assert len(cpus_of(reply.adjust.linux.resources.cpu)) == 2  # the shared pool
    assert not reply.adjust.linux.resources.cpu.HasField("quota")
    stopped = p.stop_container(
        nri.StopContainerRequest(pod=sandbox(1, "exclusive"), container=container(1, 1, 6000))
    )
    upgraded = [u for u in stopped.update if u.container_id == f"{2:064x}"]
    assert upgraded and upgraded[0].linux.resources.cpu.quota.value == NO_QUOTA
    assert len(cpus_of(upgraded[0].linux.resources.cpu)) == 2


def test_synchronize_keeps_pins_and_repairs_drift(tmp_path: Path) -> None:
    settings = NriSettings(node_name="node1", state_dir=str(tmp_path))
    first = NriPolicy(settings, single_socket_ht())
    first.synchronize([], [])
    create(first, sandbox(1), container(1, 1, 500))
    mine = cpus_of(
        create(first, sandbox(2, "exclusive"), container(2, 2, 2000)).adjust.linux.resources.cpu
    )
    # a new plugin process: the runtime reports the containers as they run; the shared one
    # drifted onto every CPU
    shared, pinned = container(1, 1, 500), container(2, 2, 2000)
    shared.linux.resources.cpu.cpus = "0-15"
    pinned.linux.resources.cpu.cpus = str(mine)
    pinned.linux.resources.cpu.mems = "0"
    pinned.linux.resources.cpu.quota.value = NO_QUOTA
    pinned.annotations[ANN_CPU_LIMIT] = "200000/100000"
    second = NriPolicy(settings, single_socket_ht())
    updates = second.synchronize([sandbox(1), sandbox(2, "exclusive")], [shared, pinned])
    (update,) = updates
    assert update.container_id == shared.id
    assert cpus_of(update.linux.resources.cpu) == CPUSet.parse("0-15") - mine
    assert second.state is not None and second.state.exclusive_cpus == mine


def test_synchronize_without_checkpoint_adopts_what_runs(tmp_path: Path) -> None:
    pinned = container(2, 2, 2000)
    pinned.linux.resources.cpu.cpus = "5,13"
    pinned.linux.resources.cpu.mems = "0"
    pinned.linux.resources.cpu.quota.value = NO_QUOTA
    pinned.annotations[ANN_CPU_LIMIT] = "200000/100000"
    p = NriPolicy(NriSettings(node_name="node1", state_dir=str(tmp_path)), single_socket_ht())
    updates = p.synchronize([sandbox(2, "exclusive")], [pinned])
    assert p.state is not None and p.state.exclusive_cpus == CPUSet.parse("5,13")
    assert not updates  # it already runs where it should


def test_a_lifted_quota_without_annotation_keeps_its_pin_across_a_restart(
    tmp_path: Path,
) -> None:
    settings = NriSettings(node_name="node1", state_dir=str(tmp_path))
    first = NriPolicy(settings, single_socket_ht())
    first.synchronize([], [])
    mine = cpus_of(
        create(first, sandbox(2, "exclusive"), container(2, 2, 2000)).adjust.linux.resources.cpu
    )
    # as an upgraded container shows after a restart: quota lifted, no kept limit
    pinned = container(2, 2, 2000)
    pinned.linux.resources.cpu.cpus = str(mine)
    pinned.linux.resources.cpu.mems = "0"
    pinned.linux.resources.cpu.quota.value = NO_QUOTA
    second = NriPolicy(settings, single_socket_ht())
    assert not second.synchronize([sandbox(2, "exclusive")], [pinned])
    assert second.state is not None and second.state.exclusive_cpus == mine


def test_view_reads_the_kubelets_resources_back() -> None:
    view = RuntimeView()
    view.pod(sandbox(1, "exclusive"))
    view.container(container(1, 1, 2000))
    plan = plan_pod(view.pod_object("sandbox1"))
    (c,) = plan.containers
    assert (c.policy, c.count, c.running) == ("exclusive", 2, True)
    view.container(container(2, 1, 1500, name="side"))
    side = plan_pod(view.pod_object("sandbox1")).container("side")
    assert side is not None and side.policy == "none" and "1500m" in side.problem


@pytest.mark.parametrize(
    ("parent", "qos"),
    [
        ("/kubepods/besteffort/pod1", "BestEffort"),
        ("kubepods-burstable-pod1.slice", "Burstable"),
        ("/kubepods/pod1", "Guaranteed"),
        ("/elsewhere/pod1", ""),
    ],
)
def test_qos_from_the_cgroup_parent(parent: str, qos: str) -> None:
    assert qos_of_parent(parent) == qos


@pytest.mark.parametrize(
    ("field", "value"), [("plugin_name", "a-b"), ("plugin_index", "7"), ("socket", "")]
)
def test_bad_settings_are_refused(field: str, value: str) -> None:
    with pytest.raises(InputError) as err:
        NriSettings(node_name="n", **{field: value})
    assert repr(value) in err.value.message or field == "socket"


# ---------------------------------------------------------------------- invariants
steps = st.lists(
    st.tuples(
        st.sampled_from(["create", "stop", "remove", "update"]),
        st.integers(0, 7),  # pod
        st.sampled_from(["none", "exclusive", "share"]),
        st.sampled_from([500, 1000, 2000, 3000]),
    ),
    max_size=30,
)


@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps)
def test_any_sequence_of_events_keeps_pins_apart(
    tmp_path_factory: pytest.TempPathFactory, run: list[tuple[str, int, str, int]]
) -> None:
    p = NriPolicy(
        NriSettings(node_name="n", state_dir=str(tmp_path_factory.mktemp("nri"))),
        single_socket_ht(),
    )
    p.synchronize([], [])
    told: dict[str, tuple[CPUSet, bool]] = {}
    serial = 0
    live: dict[int, nri.Container] = {}
    pods: dict[int, nri.PodSandbox] = {}

    def note(updates: list[nri.ContainerUpdate] | object) -> None:
        for u in updates:  # type: ignore[attr-defined]
            cpu = u.linux.resources.cpu
            told[u.container_id] = (cpus_of(cpu), cpu.HasField("quota") and cpu.quota.value < 0)

    for action, n, kind, milli in run:
        if action == "create" and n not in live:
            serial += 1
            pods[n] = sandbox(n, kind)
            live[n] = container(serial, n, milli)
            reply = create(p, pods[n], live[n])
            cpu = reply.adjust.linux.resources.cpu
            told[live[n].id] = (cpus_of(cpu), cpu.HasField("quota") and cpu.quota.value < 0)
            note(reply.update)
            started(p, pods[n], live[n])
        elif action == "stop" and n in live:
            c = live.pop(n)
            note(p.stop_container(nri.StopContainerRequest(pod=pods[n], container=c)).update)
            told.pop(c.id, None)
        elif action == "remove" and n in pods:
            c2 = live.pop(n, None)
            p.state_change(nri.StateChangeEvent(event=nri.REMOVE_POD_SANDBOX, pod=pods.pop(n)))
            if c2 is not None:
                told.pop(c2.id, None)
            continue  # no reply: the next one carries what the removal changed
        elif action == "update" and n in live:
            asked = nri.UpdateContainerRequest(pod=pods[n], container=live[n])
            asked.linux_resources.cpu.cpus = "0-15"
            note(p.update_container(asked).update)
        else:
            continue
        state = p.state
        assert state is not None
        # after every reply, what the runtime was told is what the state says, for every
        # live container
        for c in live.values():
            cpus, lifted = told[c.id]
            pin = p.pin_of(state, p.view.containers[c.id])
            assert (cpus, lifted) == (pin.cpus, pin.exclusive)
        exclusive = [told[c.id][0] for c in live.values() if told[c.id][1]]
        for i, a in enumerate(exclusive):
            assert not (a & state.shared_pool)
            for b in exclusive[i + 1 :]:
                assert not (a & b)
        assert state.shared_pool


# ---------------------------------------------------------------------- node QoS: RDT classes
def test_each_container_gets_its_qos_classes_rdt_class_in_the_create_reply(
    tmp_path: Path,
) -> None:
    resctrl = tmp_path / "resctrl"
    kernel = make_resctrl_tree(resctrl)
    config = tmp_path / "qos.yaml"
    config.write_text("classes: {LS: {resctrl: {mbaPercent: 50}}}\n")
    settings = NriSettings(
        node_name="node1",
        state_dir=str(tmp_path / "state"),
        qos_config=str(config),
        resctrl_root=str(resctrl),
    )
    rdt = RdtClasses(settings, fs=kernel)
    assert (resctrl / "corepin-be").is_dir() and (resctrl / "corepin-ls").is_dir()
    p = NriPolicy(settings, single_socket_ht(), rdt_group=rdt.group_of)
    p.synchronize([], [])

    def rdt_class(reply: nri.CreateContainerResponse) -> str | None:
        resources = reply.adjust.linux.resources
        return resources.rdt_class.value if resources.HasField("rdt_class") else None

    besteffort = sandbox(1)
    besteffort.linux.cgroup_parent = "/kubepods/besteffort/poduid-1"
    assert rdt_class(create(p, besteffort, container(1, 1, 0))) == "corepin-be"
    burstable = sandbox(2)
    burstable.linux.cgroup_parent = "/kubepods/burstable/poduid-2"
    assert rdt_class(create(p, burstable, container(2, 2, 500))) == "corepin-ls"
    exclusive = sandbox(3, "exclusive")
    assert rdt_class(create(p, exclusive, container(3, 3, 2000))) is None, "LSE: the default"
    named = sandbox(4)
    named.annotations["corepin.io/qos-class"] = "BE"
    assert rdt_class(create(p, named, container(4, 4, 500))) == "corepin-be"
    bad = sandbox(5)
    bad.linux.cgroup_parent = "/kubepods/burstable/poduid-5"
    bad.annotations["corepin.io/qos-class"] = "GOLD"
    assert rdt_class(create(p, bad, container(5, 5, 500))) == "corepin-ls", "derived instead"


def test_no_resctrl_names_no_rdt_class_and_a_bad_policy_file_is_refused(tmp_path: Path) -> None:
    settings = NriSettings(
        node_name="node1", state_dir=str(tmp_path), resctrl_root=str(tmp_path / "none")
    )
    rdt = RdtClasses(settings)
    assert rdt.classes is None and rdt.group_of("BE") is None
    bad = tmp_path / "qos.yaml"
    bad.write_text("classes: {BE: {resctrl: {l3Percent: [40, 20]}}}\n")
    with pytest.raises(InputError, match=r"classes\.BE\.resctrl\.l3Percent: start 40"):
        RdtClasses(replace(settings, qos_config=str(bad)))
