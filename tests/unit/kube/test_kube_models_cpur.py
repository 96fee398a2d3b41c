"""The CPUReservation wire model: spec and status read strictly (every refusal names its
field), owners matched as Kubernetes matches label selectors, TTLs as seconds or durations."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given

from corepin.core.cpuset import CPUSet
from corepin.kube.models import CPUReservation, FieldError, LabelSelector, parse_ttl
from support.strategies import json_values


def obj(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"owners": [{"namespace": "db"}], **spec}
    return {
        "apiVersion": "corepin.io/v1alpha1",
        "kind": "CPUReservation",
        "metadata": {"name": "r1", "uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": body,
    }


def test_a_count_reservation_reads_with_its_defaults() -> None:
    r = CPUReservation.from_dict(obj(cpus=4))
    assert (r.spec.size, r.spec.level, r.spec.allocate_once, r.spec.ttl) == (4, "cpu", True, None)
    assert r.status.phase == "Pending" and r.node_name is None and not r.done
    assert r.expires_at() is None


def test_an_exact_reservation_with_ttl_and_level_reads() -> None:
    r = CPUReservation.from_dict(obj(cpuSet="4-7", ttl="1h30m", level="NUMA", nodeName="n1"))
    assert r.spec.cpus == CPUSet.parse("4-7") and r.spec.size == 4
    assert r.spec.level == "numa" and r.node_name == "n1"
    assert r.expires_at() == datetime(2026, 1, 1, 1, 30, tzinfo=UTC)
    assert r.expired(datetime(2026, 1, 1, 1, 30, tzinfo=UTC))
    assert not r.expired(datetime(2026, 1, 1, 1, 29, tzinfo=UTC))


def test_the_status_node_stands_in_for_a_missing_spec_node() -> None:
    data = obj(cpus=2)
    data["status"] = {"phase": "Available", "nodeName": "n2", "cpus": "2-3"}
    r = CPUReservation.from_dict(data)
    assert r.node_name == "n2" and r.status.cpus == CPUSet.parse("2-3")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cpus": 2, "cpuSet": "1-2"}, "spec.cpuSet"),
        ({}, "spec.cpus"),
        ({"cpus": 0}, "spec.cpus"),
        ({"cpus": "2"}, "spec.cpus"),
        ({"cpuSet": "x"}, "spec.cpuSet"),
        ({"cpus": 1, "level": "rack"}, "spec.level"),
        ({"cpus": 1, "ttl": "soon"}, "spec.ttl"),
        ({"cpus": 1, "ttl": 0}, "spec.ttl"),
        ({"cpus": 1, "allocateOnce": "yes"}, "spec.allocateOnce"),
        ({"cpus": 1, "owners": []}, "spec.owners"),
        ({"cpus": 1, "owners": [{}]}, "spec.owners[0]"),
        (
            {"cpus": 1, "owners": [{"labelSelector": {"matchExpressions": [{"key": "a"}]}}]},
            "spec.owners[0].labelSelector.matchExpressions[0].operator",
        ),
        (
            {
                "cpus": 1,
                "owners": [
                    {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}
                ],
            },
            "spec.owners[0].labelSelector.matchExpressions[0].values",
        ),
    ],
    ids=[
        "both a count and a set",
        "neither",
        "a zero count",
        "a count as text",
        "a bad CPU list",
        "an unknown level",
        "a TTL that is no duration",
        "a zero TTL",
        "allocateOnce as text",
        "no owners",
        "an owner that names nothing",
        "an expression without operator",
        "In without values",
    ],
)
def test_a_bad_spec_is_refused_naming_its_field(spec: dict[str, Any], field: str) -> None:
    data = obj()
    data["spec"] = {"owners": [{"namespace": "db"}], **spec}
    with pytest.raises(FieldError) as err:
        CPUReservation.from_dict(data)
    assert err.value.path == field


def test_owners_match_by_namespace_name_and_selector_any_row() -> None:
    data = obj(cpus=1)
    data["spec"]["owners"] = [
        {"namespace": "db", "name": "pg-0"},
        {
            "labelSelector": {
                "matchLabels": {"app": "web"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["front", "edge"]},
                    {"key": "canary", "operator": "DoesNotExist"},
                ],
            }
        },
    ]
    r = CPUReservation.from_dict(data)
    assert r.matches("db", "pg-0", {})
    assert not r.matches("db", "pg-1", {})
    assert r.matches("any", "x", {"app": "web", "tier": "edge"})
    assert not r.matches("any", "x", {"app": "web", "tier": "back"})
    assert not r.matches("any", "x", {"app": "web", "tier": "front", "canary": "1"})


def test_not_in_matches_a_missing_label_and_an_empty_selector_matches_all() -> None:
    sel = LabelSelector.from_dict(
        {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, "s"
    )
    assert sel.matches({}) and sel.matches({"a": "y"}) and not sel.matches({"a": "x"})
    assert LabelSelector.from_dict({}, "s").matches({"anything": "at all"})


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(90, 90), ("90", 90), ("90s", 90), ("30m", 1800), ("1h30m", 5400), ("2h", 7200)],
)
def test_a_ttl_is_seconds_or_a_duration(value: object, seconds: int) -> None:
    assert parse_ttl(value) == seconds


def test_the_spec_and_status_write_back_what_they_read() -> None:
    data = obj(cpus=3, ttl=60, level="core", allocateOnce=False)
    data["status"] = {
        "phase": "Succeeded",
        "nodeName": "n1",
        "cpus": "1-3",
        "owners": [{"namespace": "db", "name": "pg-0", "uid": "p1"}],
        "message": "used",
        "expireTime": "2026-01-01T00:01:00Z",
    }
    r = CPUReservation.from_dict(data)
    assert r.done
    again = CPUReservation.from_dict(
        {**data, "spec": r.spec.to_dict(), "status": r.status.to_dict()}
    )
    assert again == r


@given(json_values(max_leaves=12))
def test_any_json_spec_either_reads_or_is_refused_with_a_field_error(spec: object) -> None:
    data = obj()
    data["spec"] = spec
    with contextlib.suppress(FieldError):
        CPUReservation.from_dict(data)
