"""The fake runtime's own helpers (tests/support/nri_runtime.py): the builders convert CPU
requests as the kubelet does, and answers are applied as the runtime applies them."""

from __future__ import annotations

from corepin.nri.gen import api_pb2
from support.nri_runtime import apply_resources, container, event_bit, pod


def test_the_builders_convert_cpu_requests_and_limits_as_the_kubelet_does() -> None:
    p = pod("web", namespace="prod", annotations={"a": "b"})
    assert (p.name, p.namespace, dict(p.annotations)) == ("web", "prod", {"a": "b"})
    assert p.id and p.uid and p.id != pod().id
    c = container(p, "app", cpu_request=0.5, cpu_limit=1.5)
    cpu = c.linux.resources.cpu
    assert c.pod_sandbox_id == p.id
    assert (cpu.shares.value, cpu.quota.value, cpu.period.value) == (512, 150_000, 100_000)
    tiny = container(p, cpu_request=0.001, cpu_limit=0.001).linux.resources.cpu
    assert (tiny.shares.value, tiny.quota.value) == (2, 1000)
    bare = container(p).linux.resources.cpu
    assert not bare.HasField("shares") and not bare.HasField("quota")


def test_applied_resources_replace_only_what_is_set_zero_included() -> None:
    held = container(pod(), cpu_request=2, cpu_limit=2, cpus="0-7", mems="0").linux.resources
    change = api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="3"))
    change.cpu.quota.value = 0  # set, even if zero
    apply_resources(held, change)
    assert (held.cpu.cpus, held.cpu.mems) == ("3", "0")
    assert held.cpu.HasField("quota") and held.cpu.quota.value == 0
    assert (held.cpu.shares.value, held.cpu.period.value) == (2048, 100_000)
    apply_resources(held, api_pb2.LinuxResources(unified={"cpu.idle": "1"}))
    assert held.cpu.cpus == "3" and dict(held.unified) == {"cpu.idle": "1"}


def test_event_bits() -> None:
    assert event_bit(api_pb2.RUN_POD_SANDBOX) == 1
    assert event_bit(api_pb2.CREATE_CONTAINER) == 8
