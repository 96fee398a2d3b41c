"""`corepin report --node NAME` and `kubectl corepin report NAME`: a node's NodeCPUTopology,
read through the API (the fake API server over real HTTP), shown as host mode shows its own
state (table, JSON, YAML, SVG)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from corepin.__main__ import plugin_argv
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.kube.client import KubeClient
from corepin.kube.models import NodeCPUTopology
from corepin.kube.nodestate import node_state
from corepin.kube.resources import CRDS, NCPT
from corepin.state.owners import ContainerOwner
from support.crd_schema import crd, load_yaml_docs
from support.helpers import run_corepin
from support.paths import DEPLOY

EXAMPLE = DEPLOY / "samples" / "nodecputopology.yaml"


def example() -> dict[str, Any]:
    (doc,) = load_yaml_docs(EXAMPLE)
    return doc


def publish(kube: KubeClient, obj: dict[str, Any]) -> None:
    """What an agent does: create the object, then write its status subresource."""
    status = obj.get("status")
    created = kube.create(NCPT, {k: v for k, v in obj.items() if k != "status"})
    if status is not None:
        created["status"] = status
        kube.replace_status(NCPT, created)


@pytest.fixture
def published(kube: KubeClient) -> dict[str, Any]:
    kube.create(CRDS, crd("nodecputopologies"))
    obj = example()
    publish(kube, obj)
    return obj


def report(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_corepin("report", "--kubeconfig", str(kubeconfig), *args)


# ---------------------------------------------------------------------- the mapping
def test_each_allocation_row_becomes_a_container_assignment_with_its_withheld_units() -> None:
    ncpt = NodeCPUTopology.from_dict(example())
    got = node_state(ncpt)
    assert got.node == "worker-1"
    db = got.state.get("shop/db-0/postgres")
    web = got.state.get("shop/web-1/nginx")
    assert db is not None and web is not None
    assert (db.kind, str(db.cpus), str(db.withheld), str(db.mems), db.level) == (
        "exclusive",
        "1,5",
        "1,5",
        "0",
        "core",
    )
    assert isinstance(db.owner, ContainerOwner)
    assert db.owner.pod_uid == "6f1c0d2e-8a4b-4c1e-9a57-0b7d2f0c1a11"
    assert (web.kind, str(web.cpus)) == ("share", "2")
    assert (db.qos_class, web.qos_class) == ("LSE", "LSR"), "published (db), else derived (web)"
    # the derived pools agree with what the agent published
    assert str(got.state.shared_pool) == got.pools["shared_pool"] == "0,2-4,6-7"
    assert str(got.state.free) == got.pools["free"] == "3,6-7"
    assert got.state.reserved == CPUSet.parse("0,4")


def test_a_level_withholds_the_rest_of_its_unit_on_the_published_topology() -> None:
    obj = example()
    obj["status"]["allocations"] = [
        {
            "namespace": "ml",
            "pod": "trainer",
            "podUID": "uid-1",
            "container": "main",
            "cpus": "2",
            "mems": "1",
            "policy": "exclusive",
            "level": "numa",
        }
    ]
    got = node_state(NodeCPUTopology.from_dict(obj))
    assert str(got.state.get("ml/trainer/main").withheld) == "2-3,6-7"  # type: ignore[union-attr]


def test_a_node_whose_allocations_overlap_is_an_input_error() -> None:
    obj = example()
    rows = obj["status"]["allocations"]
    rows[1]["cpus"] = "1"
    rows[1]["policy"] = "exclusive"
    with pytest.raises(InputError, match="does not add up"):
        node_state(NodeCPUTopology.from_dict(obj))


# ---------------------------------------------------------------------- corepin report --node
def test_report_node_json_lists_the_published_allocations_and_pools(
    published: dict[str, Any], fake_kubeconfig: Path
) -> None:
    done = report(fake_kubeconfig, "--node", "worker-1", "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["shared_pool"] == "0,2-4,6-7" and data["free"] == "3,6-7"
    assert data["reserved"] == "0,4"
    rows = {a["id"]: a for a in data["allocations"]}
    assert set(rows) == {"shop/db-0/postgres", "shop/web-1/nginx"}
    db = rows["shop/db-0/postgres"]
    assert (db["cpus"], db["exclusive"], db["kind"], db["level"], db["mems"]) == (
        "1,5",
        True,
        "exclusive",
        "core",
        "0",
    )
    assert db["owner"]["type"] == "container" and db["owner"]["pod"] == "db-0"
    assert db["pid"] is None and db["status"] is None
    assert rows["shop/web-1/nginx"]["exclusive"] is False
    # the QoS class: the one published (LSE), else derived from how it is pinned (LSR)
    assert (db["qos_class"], rows["shop/web-1/nginx"]["qos_class"]) == ("LSE", "LSR")
    as_yaml = yaml.safe_load(report(fake_kubeconfig, "--node", "worker-1", "-o", "yaml").stdout)
    assert as_yaml == data


def test_report_node_table_and_svg_show_the_containers(
    published: dict[str, Any], fake_kubeconfig: Path
) -> None:
    table = report(fake_kubeconfig, "--node", "worker-1")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "ID",
        "NAME",
        "PID",
        "KIND",
        "QOS",
        "CPUS",
        "MEMS",
        "STATUS",
        "COMMAND",
    ]
    db = next(line for line in lines if line.startswith("shop/db-0/postgres"))
    assert db.split() == [
        "shop/db-0/postgres",
        "shop/db-0/postgres",
        "-",
        "exclusive",
        "LSE",
        "1,5",
        "0",
        "-",
    ]
    assert "shared pool: 0,2-4,6-7" in lines and "free:        3,6-7" in lines
    svg = report(fake_kubeconfig, "--node", "worker-1", "-o", "svg")
    assert svg.returncode == 0, svg.stderr
    assert "<svg" in svg.stdout and "shop/db-0/postgres" in svg.stdout
    assert "shop/web-1/nginx" in svg.stdout


def test_report_node_reads_kubeconfig_from_the_environment(
    published: dict[str, Any], fake_kubeconfig: Path
) -> None:
    env = {**os.environ, "KUBECONFIG": str(fake_kubeconfig)}
    done = run_corepin("report", "--node", "worker-1", "-o", "json", env=env)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["allocations"]) == 2


def test_a_node_without_a_node_cpu_topology_exits_2_naming_it(
    published: dict[str, Any], fake_kubeconfig: Path
) -> None:
    done = report(fake_kubeconfig, "--node", "worker-9")
    assert done.returncode == 2
    assert "worker-9" in done.stderr and "no NodeCPUTopology" in done.stderr
    assert done.stderr.count("\n") == 1


def test_an_api_without_the_crd_exits_4_saying_so(kube: KubeClient, fake_kubeconfig: Path) -> None:
    done = report(fake_kubeconfig, "--node", "worker-1")
    assert done.returncode == 4
    assert "CRDs installed" in done.stderr and done.stderr.count("\n") == 1


def test_an_unreachable_api_exits_4(tmp_path: Path, fake_kubeconfig: Path) -> None:
    config = yaml.safe_load(fake_kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:1"
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    done = report(dead, "--node", "worker-1")
    assert done.returncode == 4 and done.stderr.count("\n") == 1


def test_kubeconfig_without_node_is_a_usage_error(fake_kubeconfig: Path) -> None:
    done = report(fake_kubeconfig)
    assert done.returncode == 2 and "--node" in done.stderr


def test_agent_and_node_are_mutually_exclusive() -> None:
    done = run_corepin("report", "--agent", "/run/x.sock", "--node", "n")
    assert done.returncode == 2 and "not allowed with" in done.stderr


# ---------------------------------------------------------------------- kubectl corepin
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["report", "n1"], ["report", "--node", "n1"]),
        (["report", "n1", "-o", "json"], ["report", "--node", "n1", "-o", "json"]),
        (["report", "-o", "json", "n1"], ["report", "--node", "n1", "-o", "json"]),
        (
            ["report", "--kubeconfig", "k", "n1", "--out", "f"],
            ["report", "--node", "n1", "--kubeconfig", "k", "--out", "f"],
        ),
        (["report", "--output=yaml", "n1"], ["report", "--node", "n1", "--output=yaml"]),
        (["report"], None),
        (["report", "-o", "json"], None),
        (["topology"], None),
        ([], None),
        (["report", "n1", "--help"], None),
    ],
    ids=[
        "the node name",
        "options after it",
        "an option and its value before it",
        "the kubeconfig and an output file around it",
        "an option written with =",
        "no node name",
        "only options",
        "another command",
        "nothing",
        "help",
    ],
)
def test_plugin_arguments_become_report_node(args: list[str], expected: list[str] | None) -> None:
    assert plugin_argv(args) == expected


def plugin_dir() -> str:
    """Where the `kubectl-corepin` console script of this environment lives."""
    found = shutil.which("kubectl-corepin", path=os.path.dirname(sys.executable))
    if found is None:
        pytest.skip("kubectl-corepin is not installed in this environment (pip install -e .)")
    return os.path.dirname(found)


def test_kubectl_finds_the_plugin_and_runs_report_for_a_node(
    published: dict[str, Any], fake_kubeconfig: Path
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    env = {
        **os.environ,
        "PATH": plugin_dir() + os.pathsep + os.environ.get("PATH", ""),
        "KUBECONFIG": str(fake_kubeconfig),
    }
    listed = subprocess.run(
        [kubectl, "plugin", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert "kubectl-corepin" in listed.stdout, listed.stdout + listed.stderr
    done = subprocess.run(
        [kubectl, "corepin", "report", "worker-1", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    direct = report(fake_kubeconfig, "--node", "worker-1", "-o", "json")
    assert done.stdout == direct.stdout
    assert len(json.loads(done.stdout)["allocations"]) == 2
    missing = subprocess.run(
        [kubectl, "corepin", "report", "worker-9"], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "worker-9" in missing.stderr
    usage = subprocess.run([kubectl, "corepin"], env=env, capture_output=True, text=True)
    assert usage.returncode == 2 and "kubectl corepin report NODE" in usage.stderr


def test_report_node_lists_the_reservations_the_agent_holds(
    kube: KubeClient, fake_kubeconfig: Path
) -> None:
    kube.create(CRDS, crd("nodecputopologies"))
    obj = example()
    obj["status"]["reservations"] = [
        {"name": "db-next", "cpus": "6-7", "phase": "Available"},
        {"name": "web-once", "cpus": "3", "phase": "Succeeded", "consumedBy": "shop/web-2"},
    ]
    publish(kube, obj)
    data = json.loads(report(fake_kubeconfig, "--node", "worker-1", "-o", "json").stdout)
    rows = {r["name"]: r for r in data["reservations"]}
    assert rows["db-next"] == {
        "name": "db-next",
        "cpus": "6-7",
        "expires": None,
        "consumed_by": None,
        "phase": "Available",
    }
    assert rows["web-once"]["consumed_by"] == "shop/web-2"
    table = report(fake_kubeconfig, "--node", "worker-1").stdout
    assert "Reservations:" in table and "db-next" in table and "shop/web-2" in table
