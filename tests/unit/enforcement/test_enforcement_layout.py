"""Kubelet cgroup path layouts (cgroupfs and systemd) and finding containers by id."""

from __future__ import annotations

from pathlib import Path

import pytest

from corepin.core.ids import IdError
from corepin.enforcement.layout import (
    Layout,
    container_cgroup_path,
    container_dir_name,
    docker_cgroup_path,
    find_container_cgroup,
    index_container_cgroups,
    parse_container_dir,
    pod_cgroup_path,
    qos_cgroup_path,
)

UID = "0f8c2a6e-3b1d-4c2e-9a57-1d2e3f4a5b6c"
UID_ = UID.replace("-", "_")
CID = "9d2b" * 16


@pytest.mark.parametrize(
    ("layout", "qos", "runtime", "expected"),
    [
        pytest.param(
            "cgroupfs",
            "burstable",
            "containerd",
            f"kubepods/burstable/pod{UID}/{CID}",
            id="cgroupfs burstable containerd container sits under its QoS and pod",
        ),
        pytest.param(
            "cgroupfs",
            "guaranteed",
            "containerd",
            f"kubepods/pod{UID}/{CID}",
            id="cgroupfs guaranteed pods sit directly under kubepods",
        ),
        pytest.param(
            "cgroupfs",
            "besteffort",
            "cri-o",
            f"kubepods/besteffort/pod{UID}/crio-{CID}",
            id="cgroupfs CRI-O containers are named crio-<id>",
        ),
        pytest.param(
            "cgroupfs",
            "burstable",
            "docker",
            f"kubepods/burstable/pod{UID}/{CID}",
            id="cgroupfs docker containers are the bare id",
        ),
        pytest.param(
            "systemd",
            "burstable",
            "containerd",
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope",
            id="systemd burstable containerd: slices spell their ancestry, uid uses underscores",
        ),
        pytest.param(
            "systemd",
            "guaranteed",
            "containerd",
            f"kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
            id="systemd guaranteed pods are a slice directly under kubepods.slice",
        ),
        pytest.param(
            "systemd",
            "besteffort",
            "cri-o",
            f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
            f"crio-{CID}.scope",
            id="systemd CRI-O containers are crio-<id>.scope",
        ),
        pytest.param(
            "systemd",
            "burstable",
            "docker",
            f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"docker-{CID}.scope",
            id="systemd docker containers are docker-<id>.scope",
        ),
    ],
)
def test_container_paths_follow_the_kubelet_layouts(
    layout: str, qos: str, runtime: str, expected: str
) -> None:
    assert container_cgroup_path(layout, qos, UID, runtime, CID) == expected


def test_systemd_underscore_uid_is_accepted_and_gives_the_same_path() -> None:
    a = pod_cgroup_path(Layout.SYSTEMD, "burstable", UID)
    b = pod_cgroup_path(Layout.SYSTEMD, "burstable", UID_)
    assert a == b == f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"


def test_custom_cgroup_root_is_prefixed_in_both_layouts() -> None:
    assert qos_cgroup_path("cgroupfs", "burstable", cgroup_root="/custom") == (
        "custom/kubepods/burstable"
    )
    assert qos_cgroup_path("systemd", "burstable", cgroup_root="custom") == (
        "custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice"
    )
    assert qos_cgroup_path("systemd", "guaranteed") == "kubepods.slice"


def test_docker_outside_kubernetes() -> None:
    assert docker_cgroup_path("cgroupfs", CID) == f"docker/{CID}"
    assert docker_cgroup_path("systemd", CID) == f"system.slice/docker-{CID}.scope"


def test_generic_runtime_names_for_ctr_run_containers() -> None:
    assert container_dir_name("cgroupfs", "generic", "probe-1") == "probe-1"
    assert container_dir_name("systemd", "generic", "probe-1") == "probe-1.scope"


@pytest.mark.parametrize(
    ("qos", "uid", "runtime", "cid"),
    [
        pytest.param("burstable", "../../etc", "containerd", CID, id="a traversal pod uid"),
        pytest.param("burstable", UID, "containerd", "../" + CID[3:], id="a traversal id"),
        pytest.param("burstable", UID, "containerd", "x" * 64, id="a non-hex containerd id"),
        pytest.param("gold", UID, "containerd", CID, id="an unknown QoS class"),
        pytest.param("burstable", UID, "rkt", CID, id="an unknown runtime"),
        pytest.param("burstable", UID + "\x00", "containerd", CID, id="a NUL in the pod uid"),
    ],
)
def test_bad_components_are_rejected(qos: str, uid: str, runtime: str, cid: str) -> None:
    for layout in Layout:
        with pytest.raises(IdError):
            container_cgroup_path(layout, qos, uid, runtime, cid)


def test_unknown_layout_is_rejected() -> None:
    with pytest.raises(IdError, match="cgroupfs"):
        pod_cgroup_path("cgroupv3", "burstable", UID)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"cri-containerd-{CID}.scope", ("containerd", CID)),
        (f"crio-{CID}.scope", ("cri-o", CID)),
        (f"crio-{CID}", ("cri-o", CID)),
        (f"docker-{CID}.scope", ("docker", CID)),
        (f"libpod-{CID}.scope", ("podman", CID)),
        (CID, ("containerd", CID)),
        (f"crio-conmon-{CID}.scope", None),
        ("kubepods.slice", None),
        (f"pod{UID}", None),
    ],
)
def test_container_directory_names_are_recognised(
    name: str, expected: tuple[str, str] | None
) -> None:
    assert parse_container_dir(name) == expected


def _tree(root: Path, paths: list[str]) -> None:
    for p in paths:
        (root / p).mkdir(parents=True, exist_ok=True)


def test_find_container_by_scanning_both_layouts(tmp_path: Path) -> None:
    other = "1a2b" * 16
    paths = [
        container_cgroup_path("cgroupfs", "burstable", UID, "containerd", CID),
        container_cgroup_path("systemd", "guaranteed", UID, "cri-o", other),
        "system.slice/containerd.service",
    ]
    _tree(tmp_path, paths)
    assert find_container_cgroup(tmp_path, CID) == paths[0]
    assert find_container_cgroup(tmp_path, other) == paths[1]
    assert find_container_cgroup(tmp_path, other, runtime="cri-o") == paths[1]
    assert find_container_cgroup(tmp_path, "5e6f" * 16) is None
    assert find_container_cgroup(tmp_path, CID, under=["kubepods.slice"]) is None
    assert find_container_cgroup(tmp_path, "probe-1", runtime="generic") is None
    with pytest.raises(IdError):
        find_container_cgroup(tmp_path, "../x")
    assert index_container_cgroups(tmp_path) == {CID: paths[0], other: paths[1]}


def test_find_a_ctr_run_container_by_name(tmp_path: Path) -> None:
    _tree(tmp_path, ["kubepods/burstable/podx/probe-1"])
    assert find_container_cgroup(tmp_path, "probe-1") == "kubepods/burstable/podx/probe-1"
