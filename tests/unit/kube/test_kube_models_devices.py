"""The device parts of the models: `corepin.io/device-alignment` and
`NodeCPUTopology.status.devices` (old objects without it still read)."""

from __future__ import annotations

from typing import Any

import pytest

from corepin.core.errors import InputError
from corepin.kube.models import NodeCPUTopologyStatus, NodeDevices, parse_pod_annotations
from corepin.kube.podplan import plan_pod
from support.pods import EXCLUSIVE, container, pod


@pytest.mark.parametrize("value", ["preferred", "required", "none"])
def test_device_alignment_values(value: str) -> None:
    wanted = parse_pod_annotations({"corepin.io/device-alignment": value})
    assert wanted.device_alignment == value
    p = pod("p", container("app", "2", "2"), annotations={**EXCLUSIVE, **{
        "corepin.io/device-alignment": value}})  # fmt: skip
    assert plan_pod(p).containers[0].device_alignment == value


def test_device_alignment_defaults_to_preferred() -> None:
    assert parse_pod_annotations({}).device_alignment == "preferred"


def test_a_bad_device_alignment_names_the_key_and_value() -> None:
    with pytest.raises(InputError, match=r"corepin.io/device-alignment.*'sometimes'"):
        parse_pod_annotations({"corepin.io/device-alignment": "sometimes"})


STATUS: dict[str, Any] = {"sharedPool": "0-3", "free": "0-3"}


def test_status_without_devices_reads_and_writes_none() -> None:
    status = NodeCPUTopologyStatus.from_dict(STATUS)
    assert status.devices == ()
    assert "devices" not in status.to_dict()


def test_status_devices_round_trip() -> None:
    rows = [
        {"resource": "nvidia.com/gpu", "numaNode": 0, "count": 2, "allocatable": 1},
        {"resource": "nvidia.com/gpu", "count": 1, "allocatable": 1},
    ]
    status = NodeCPUTopologyStatus.from_dict({**STATUS, "devices": rows})
    assert status.devices == (
        NodeDevices("nvidia.com/gpu", 0, 2, 1),
        NodeDevices("nvidia.com/gpu", None, 1, 1),
    )
    assert status.to_dict()["devices"] == rows
    assert NodeCPUTopologyStatus.from_dict(status.to_dict()) == status


@pytest.mark.parametrize(
    ("row", "named"),
    [
        ({"resource": "", "count": 1, "allocatable": 1}, "resource"),
        ({"resource": "a/b", "count": 1, "allocatable": 2}, "allocatable"),
        ({"resource": "a/b", "count": -1, "allocatable": 0}, "count"),
        ({"resource": "a/b", "numaNode": "1", "count": 1, "allocatable": 1}, "numaNode"),
    ],
)
def test_bad_device_rows_name_the_field(row: dict[str, Any], named: str) -> None:
    with pytest.raises(InputError, match=named):
        NodeCPUTopologyStatus.from_dict({**STATUS, "devices": [row]})


def test_a_resource_and_numa_node_is_listed_once() -> None:
    row = {"resource": "a/b", "numaNode": 0, "count": 1, "allocatable": 1}
    with pytest.raises(InputError, match=r"status\.devices"):
        NodeCPUTopologyStatus.from_dict({**STATUS, "devices": [row, row]})
