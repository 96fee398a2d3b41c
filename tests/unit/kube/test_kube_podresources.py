"""corepin.kube.podresources against the tests' own PodResources server on a real unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.kube.podresources import (
    ContainerKey,
    DeviceCount,
    DeviceGroup,
    PodResourcesClient,
    PodResourcesUnavailable,
    container_numa,
    devices_by_numa,
    numa_nodes,
)
from support.podresources_server import Devices, PodResourcesServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PodResourcesServer]:
    with PodResourcesServer(tmp_path / "kubelet.sock") as s:
        yield s


@pytest.fixture
def client(server: PodResourcesServer) -> Iterator[PodResourcesClient]:
    c = PodResourcesClient(server.socket, timeout=10)
    yield c
    c.close()


def test_list_gives_each_container_its_devices_with_their_numa_nodes(
    server: PodResourcesServer, client: PodResourcesClient
) -> None:
    server.assign("ml", "train", "main", Devices("nvidia.com/gpu", ["gpu1", "gpu3"], [1]))
    server.assign("ml", "train", "side", Devices("example.com/nic", ["vf0"], []))
    listed = client.list()
    assert listed == {
        ContainerKey("ml", "train", "main"): (
            DeviceGroup("nvidia.com/gpu", ("gpu1", "gpu3"), CPUSet.of(1)),
        ),
        ContainerKey("ml", "train", "side"): (DeviceGroup("example.com/nic", ("vf0",)),),
    }
    # a device of no NUMA node adds no preference
    assert container_numa(listed, "ml", "train") == {"main": CPUSet.of(1)}
    assert container_numa(listed, "ml", "other") == {}


def test_allocatable_groups_devices_per_resource_and_numa_node(
    server: PodResourcesServer, client: PodResourcesClient
) -> None:
    server.allocatable = [
        Devices("nvidia.com/gpu", ["gpu2"], [1]),
        Devices("nvidia.com/gpu", ["gpu0"], [0]),
        Devices("nvidia.com/gpu", ["gpu1"], [0]),
    ]
    got = client.allocatable()
    assert got == (
        DeviceGroup("nvidia.com/gpu", ("gpu0", "gpu1"), CPUSet.of(0)),
        DeviceGroup("nvidia.com/gpu", ("gpu2",), CPUSet.of(1)),
    )
    used = (DeviceGroup("nvidia.com/gpu", ("gpu1",), CPUSet.of(0)),)
    assert devices_by_numa(got, used) == (
        DeviceCount("nvidia.com/gpu", 0, 2, 1),
        DeviceCount("nvidia.com/gpu", 1, 1, 1),
    )


def test_devices_of_no_numa_node_are_counted_apart() -> None:
    rows = devices_by_numa(
        [DeviceGroup("a/x", ("1", "2")), DeviceGroup("a/x", ("3",), CPUSet.of(2))]
    )
    assert rows == (DeviceCount("a/x", None, 2, 2), DeviceCount("a/x", 2, 1, 1))


def test_numa_nodes_unites_the_groups() -> None:
    groups = [DeviceGroup("a/x", ("1",), CPUSet.of(0)), DeviceGroup("a/y", ("2",), CPUSet.of(3))]
    assert numa_nodes(groups) == CPUSet.of(0, 3)
    assert numa_nodes([]) == CPUSet()


def test_no_socket_is_a_clear_error(tmp_path: Path) -> None:
    client = PodResourcesClient(str(tmp_path / "missing.sock"))
    with pytest.raises(PodResourcesUnavailable, match=r"no kubelet PodResources socket at .*"):
        client.list()


def test_a_server_that_is_gone_is_a_clear_error(tmp_path: Path) -> None:
    server = PodResourcesServer(tmp_path / "kubelet.sock").start()
    client = PodResourcesClient(server.socket, timeout=2)
    try:
        assert client.list() == {}
        server.stop()
        Path(server.socket).touch()  # a path that is there but answers nothing
        with pytest.raises(PodResourcesUnavailable, match=r"answered /v1\.PodResourcesLister/List"):
            client.list()
    finally:
        client.close()


def test_the_test_server_gives_devices_as_the_kubelet_does(
    server: PodResourcesServer, client: PodResourcesClient
) -> None:
    server.allocatable = [Devices("nvidia.com/gpu", ["g0", "g1"], [1])]
    pod = {
        "metadata": {"namespace": "default", "name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "1"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]
        },
    }
    server.from_kubelet([pod])
    listed = client.list()
    assert listed[ContainerKey("default", "p", "a")][0].ids == ("g0",)
    assert listed[ContainerKey("default", "p", "b")][0].ids == ("g1",)
