"""`corepin report` with node QoS: the QOS column of the table and the per-class resctrl
section, drawn from the report's data (`corepin.cli.render.report`)."""

from __future__ import annotations

from typing import Any

from corepin.cli.render.report import report_table


def row(ident: str, qos: str | None) -> dict[str, Any]:
    return {
        "id": ident,
        "name": ident,
        "pid": 10,
        "kind": "shared",
        "qos_class": qos,
        "cpus": "0-3",
        "mems": "0",
        "status": "running",
        "command": "sleep 60",
    }


def data(*rows: dict[str, Any], classes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "allocations": list(rows),
        "shared_pool": "0-3",
        "free": "0-3",
        "reserved": "",
    }
    if classes is not None:
        out["qos_classes"] = classes
    return out


BE_VIEW = {
    "class": "BE",
    "group": "corepin-be",
    "l3": {"0": {"mask": "3f", "ways": 6}, "1": {"mask": "3f", "ways": 6}},
    "mb": {"0": 50, "1": 50},
    "mbUnit": "percent",
    "monitoring": {
        "0": {"llcOccupancyBytes": 3 << 20, "mbmTotalBytes": 1, "mbmLocalBytes": 1},
        "1": {"llcOccupancyBytes": 512, "mbmTotalBytes": 1, "mbmLocalBytes": 1},
    },
}


def test_the_table_shows_each_runs_class_after_its_kind() -> None:
    text = report_table(data(row("run-1", "BE"), row("run-2", "LS"), row("pod/x", None)))
    lines = text.splitlines()
    assert lines[0].split()[:6] == ["ID", "NAME", "PID", "KIND", "QOS", "CPUS"]
    assert [line.split()[4] for line in lines[1:4]] == ["BE", "LS", "-"]


def test_resctrl_classes_get_a_section_with_ways_bandwidth_and_occupancy_per_domain() -> None:
    text = report_table(data(row("run-1", "BE"), classes=[BE_VIEW]))
    section = text.split("QoS classes (resctrl):\n", 1)[1].splitlines()
    assert section[0].split() == ["CLASS", "GROUP", "L3", "WAYS", "MB", "LLC", "OCCUPANCY"]
    assert section[1].split() == ["BE", "corepin-be", "0=6;1=6", "0=50%;1=50%", "0=3.0MiB;1=512B"]


def test_without_resctrl_the_report_has_no_class_section() -> None:
    assert "QoS classes" not in report_table(data(row("run-1", "BE")))
    assert "QoS classes" not in report_table(data(row("run-1", "BE"), classes=[]))
