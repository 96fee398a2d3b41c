"""Node QoS, the pure part: classes, the policy's shape and refusals, the best-effort budget and
CPU set, CPU burst steps."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin.allocation.qos import (
    CLASSES,
    BeSuppress,
    BurstState,
    ClassPolicy,
    CpuBurst,
    QosPolicy,
    auto_step,
    be_budget,
    be_quota_us,
    burst_us_for,
    check_class,
    class_of,
    decide_burst,
    default_class_policies,
    grow_step,
    next_be_cpus,
    parse_class_policies,
    parse_policy,
    parse_policy_text,
)
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from support.budget import examples
from support.strategies import cpusets


# ---------------------------------------------------------------------- classes
@pytest.mark.parametrize(
    ("kind", "kube_qos", "given_class", "want"),
    [
        pytest.param("exclusive", None, None, "LSE", id="an exclusive run is LSE"),
        pytest.param("mixed", "guaranteed", None, "LSE", id="a mixed container is LSE"),
        pytest.param("share", "burstable", None, "LSR", id="a share container is LSR"),
        pytest.param("shared", "guaranteed", None, "LS", id="a guaranteed pod on the pool is LS"),
        pytest.param("shared", "burstable", None, "LS", id="a burstable pod is LS"),
        pytest.param("shared", "besteffort", None, "BE", id="a besteffort pod is BE"),
        pytest.param("shared", None, None, "LS", id="a shared run is LS"),
        pytest.param("shared", "burstable", "be", "BE", id="the given class wins, any case"),
        pytest.param("exclusive", None, "SYSTEM", "SYSTEM", id="even over exclusiveness"),
    ],
)
def test_class_of(kind: str, kube_qos: str | None, given_class: str | None, want: str) -> None:
    assert class_of(kind, kube_qos, given_class) == want


@pytest.mark.parametrize("value", ["GOLD", "", 3, None, "L S"])
def test_a_bad_class_is_named(value: object) -> None:
    with pytest.raises(InputError) as info:
        check_class(value, "--qos-class")
    assert str(info.value).startswith(f"--qos-class: {value!r}")
    assert info.value.exit_code == 2


# ---------------------------------------------------------------------- the policy
def test_the_default_policy() -> None:
    policy = parse_policy(None)
    assert policy == QosPolicy() == parse_policy({})
    assert policy.classes["BE"] == ClassPolicy((0, 30), 100)
    assert {policy.classes[c] for c in CLASSES if c != "BE"} == {ClassPolicy((0, 100), 100)}
    assert policy.be_suppress == BeSuppress("cpuset", 65, 2)
    assert policy.cpu_burst.policy == "none"
    assert not policy.cpu_burst.burst_on and not policy.cpu_burst.quota_on
    assert policy.be_cpu_idle is False


def test_a_whole_policy_is_read_and_given_back_in_the_same_shape() -> None:
    text = """
classes:
  BE: {resctrl: {l3Percent: [0, 20], mbaPercent: 40}}
  LS: {resctrl: {mbaPercent: 80}}
beSuppress: {policy: cfsQuota, sloPercent: 70, minCPUs: 1}
cpuBurst: {policy: auto, burstPercent: 200, maxQuotaPercent: 250, shareUsageLimitPercent: 60}
beCPUIdle: true
"""
    policy = parse_policy_text(text, "qos.yaml")
    assert policy.classes["BE"] == ClassPolicy((0, 20), 40)
    assert policy.classes["LS"] == ClassPolicy((0, 100), 80), "left-out fields keep defaults"
    assert policy.be_suppress == BeSuppress("cfsQuota", 70, 1)
    assert policy.cpu_burst == CpuBurst("auto", 200, 250, 60)
    assert policy.cpu_burst.burst_on and policy.cpu_burst.quota_on
    assert policy.be_cpu_idle is True
    assert parse_policy(policy.to_json()) == policy
    assert parse_policy_text('{"beCPUIdle": true}', "x.json").be_cpu_idle is True


def test_a_bare_off_in_yaml_means_the_policy_off() -> None:
    # YAML 1.1 reads `off` as false; users write it as the policy's name
    assert parse_policy_text("beSuppress: {policy: off}", "q").be_suppress.policy == "off"
    assert parse_policy_text("beSuppress: {policy: 'off'}", "q").be_suppress.policy == "off"
    with pytest.raises(InputError, match=r"cpuBurst\.policy: False is not one of"):
        parse_policy_text("cpuBurst: {policy: off}", "q")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"classes": {"BE": {"resctrl": {"l3Percent": [30, 30]}}}}, "classes.BE.resctrl.l3Percent"),
        ({"classes": {"BE": {"resctrl": {"l3Percent": [0, 101]}}}}, "classes.BE.resctrl.l3Percent"),
        ({"classes": {"BE": {"resctrl": {"l3Percent": [0]}}}}, "classes.BE.resctrl.l3Percent"),
        ({"classes": {"BE": {"resctrl": {"l3Percent": [0, 2.5]}}}}, "classes.BE.resctrl.l3Percent"),
        ({"classes": {"LS": {"resctrl": {"mbaPercent": 0}}}}, "classes.LS.resctrl.mbaPercent"),
        ({"classes": {"LS": {"resctrl": {"mbaPercent": True}}}}, "classes.LS.resctrl.mbaPercent"),
        ({"classes": {"LS": {"resctrl": {"l3percent": [0, 1]}}}}, "classes.LS.resctrl.l3percent"),
        ({"classes": {"GOLD": {"resctrl": {}}}}, "classes.GOLD"),
        ({"classes": {"BE": {"cache": {}}}}, "classes.BE.cache"),
        ({"classes": {"BE": {"resctrl": [0, 30]}}}, "classes.BE.resctrl"),
        ({"classes": [1, 2]}, "classes"),
        ({"beSuppress": {"policy": "cgroup"}}, "beSuppress.policy"),
        ({"beSuppress": {"sloPercent": 150}}, "beSuppress.sloPercent"),
        ({"beSuppress": {"sloPercent": 0}}, "beSuppress.sloPercent"),
        ({"beSuppress": {"minCPUs": 0}}, "beSuppress.minCPUs"),
        ({"beSuppress": {"minCPUs": "2"}}, "beSuppress.minCPUs"),
        ({"beSuppress": {"min_cpus": 2}}, "beSuppress.min_cpus"),
        ({"beSuppress": "cpuset"}, "beSuppress"),
        ({"cpuBurst": {"policy": "always"}}, "cpuBurst.policy"),
        ({"cpuBurst": {"burstPercent": -1}}, "cpuBurst.burstPercent"),
        ({"cpuBurst": {"maxQuotaPercent": 50}}, "cpuBurst.maxQuotaPercent"),
        ({"cpuBurst": {"shareUsageLimitPercent": 101}}, "cpuBurst.shareUsageLimitPercent"),
        ({"beCPUIdle": "yes"}, "beCPUIdle"),
        ({"bePolicy": {}}, "policy.bePolicy"),
        ([1], "policy"),
    ],
)
def test_a_bad_value_is_refused_by_its_field(data: object, field: str) -> None:
    with pytest.raises(InputError) as info:
        parse_policy(data)
    assert str(info.value).startswith(field + ":"), str(info.value)
    assert info.value.exit_code == 2
    assert info.value.reason == "bad_qos_policy"


def test_text_errors_name_the_source() -> None:
    with pytest.raises(InputError, match=r"^qos\.yaml: beSuppress\.sloPercent: 0 is outside"):
        parse_policy_text("beSuppress: {sloPercent: 0}", "qos.yaml")
    with pytest.raises(InputError, match=r"^ConfigMap ns/corepin-qos: not YAML or JSON \(line 1\)"):
        parse_policy_text("classes: [", "ConfigMap ns/corepin-qos")


def test_class_policies_keep_the_defaults_of_classes_not_named() -> None:
    got = parse_class_policies({"BE": {"resctrl": {"mbaPercent": 40}}})
    want = default_class_policies()
    want["BE"] = ClassPolicy((0, 30), 40)
    assert got == want


@settings(max_examples=examples(200))
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "classes",
                        "beSuppress",
                        "cpuBurst",
                        "beCPUIdle",
                        "BE",
                        "LS",
                        "resctrl",
                        "l3Percent",
                        "mbaPercent",
                        "policy",
                        "sloPercent",
                        "minCPUs",
                        "burstPercent",
                        "x",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_any_document_is_a_policy_or_an_input_error(data: object) -> None:
    try:
        policy = parse_policy(data)
    except InputError as err:
        assert err.reason == "bad_qos_policy"
        return
    assert parse_policy(policy.to_json()) == policy


# ---------------------------------------------------------------------- suppression
def test_the_budget_follows_koordinators_formula() -> None:
    # 16 CPUs at 65 %: 10.4; LS used 4, system used 1 but 2 reserved -> 4.4
    assert be_budget(16, 65, 4.0, 1.0, 2) == pytest.approx(4.4)
    assert be_budget(16, 65, 4.0, 3.0, 2) == pytest.approx(3.4)
    assert be_budget(4, 65, 4.0, 0.0, 0) == 0.0, "never below zero"


def test_the_quota_is_the_budget_with_a_floor() -> None:
    assert be_quota_us(2.5, 100_000) == 250_000
    assert be_quota_us(0.0, 100_000) == 2000


def test_the_cpu_set_grows_by_a_tenth_and_shrinks_at_once() -> None:
    candidates = CPUSet(range(2, 16))
    start = CPUSet([14, 15])
    grown = next_be_cpus(start, 12.0, candidates, 16, 2)
    assert grown == CPUSet([12, 13, 14, 15]), "2 more (a tenth of 16, rounded up)"
    assert next_be_cpus(grown, 1.0, candidates, 16, 2) == CPUSet([14, 15])
    assert next_be_cpus(grown, 3.0, candidates, 16, 2) == CPUSet([13, 14, 15])
    assert next_be_cpus(grown, 3.0, CPUSet(), 16, 2) == CPUSet()


@settings(max_examples=examples(300))
@given(
    current=cpusets(st.integers(0, 31)),
    candidates=cpusets(st.integers(0, 31)),
    budget=st.floats(0, 40, allow_nan=False),
    min_cpus=st.integers(1, 6),
)
def test_be_cpus_invariants(
    current: CPUSet, candidates: CPUSet, budget: float, min_cpus: int
) -> None:
    total = 32
    got = next_be_cpus(current, budget, candidates, total, min_cpus)
    kept = current & candidates
    assert got <= candidates, "never an exclusive, reserved or LSR CPU"
    assert len(got) >= min(min_cpus, len(candidates)), "at least minCPUs while there are some"
    if kept:
        assert len(got) <= max(len(kept) + grow_step(total), min(min_cpus, len(candidates)))
    if len(got) <= len(kept):
        assert got <= kept, "a shrink keeps CPUs BE has, it never swaps them"
    else:
        assert kept <= got, "a grow keeps every CPU BE has"
    want = max(math.floor(budget + 1e-9), min_cpus)
    assert len(got) <= max(want, min(min_cpus, len(candidates)))


# ---------------------------------------------------------------------- burst
def test_burst_is_clamped_to_the_quota_in_force() -> None:
    assert burst_us_for(100_000, 100_000, 50) == 50_000
    assert burst_us_for(100_000, 100_000, 1000) == 100_000
    assert burst_us_for(100_000, 120_000, 1000) == 120_000


def test_auto_raises_while_throttled_and_resets_on_a_busy_pool() -> None:
    policy = CpuBurst("auto", 1000, 300, 50)
    scale = 1.0
    for _ in range(10):
        scale = auto_step(scale, True, 10.0, policy)
    assert scale == pytest.approx(3.0), "capped at maxQuotaPercent"
    assert auto_step(scale, False, 10.0, policy) == pytest.approx(2.4)
    assert auto_step(1.1, False, 10.0, policy) == 1.0
    assert auto_step(scale, True, 51.0, policy) == 1.0


def test_decide_burst_per_policy() -> None:
    base = 100_000
    primed = BurstState(1.0, 5)
    only = decide_burst(base, primed, 9, 10.0, CpuBurst("cpuBurstOnly", 1000, 300, 50))
    assert (only.quota_us, only.burst_us) == (base, base)
    quota = decide_burst(base, primed, 9, 10.0, CpuBurst("cfsQuotaBurstOnly", 1000, 300, 50))
    assert (quota.quota_us, quota.burst_us) == (120_000, 0)
    auto = decide_burst(base, quota.state, 9, 10.0, CpuBurst("auto", 50, 300, 50))
    assert auto.quota_us == 100_000 and auto.burst_us == 50_000, "not throttled again: back"
    busy = decide_burst(base, BurstState(2.0, 5), 9, 90.0, CpuBurst("auto", 1000, 300, 50))
    assert (busy.quota_us, busy.burst_us) == (base, 0), "a busy pool resets everything"
    first = decide_burst(base, BurstState(), 9, 10.0, CpuBurst("auto", 1000, 300, 50))
    assert first.quota_us == base, "the first reading only primes the counter"


@settings(max_examples=examples(200))
@given(
    st.lists(st.tuples(st.integers(0, 3), st.floats(0, 100)), max_size=30),
    st.sampled_from(["none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto"]),
    st.integers(1, 2000),
    st.integers(100, 500),
)
def test_burst_stays_within_what_the_kernel_and_the_policy_allow(
    steps: list[tuple[int, float]], name: str, burst_percent: int, max_quota: int
) -> None:
    policy = CpuBurst(name, burst_percent, max_quota, 50)
    base = 50_000
    state = BurstState()
    counter = 0
    for throttled_more, busy in steps:
        counter += throttled_more
        got = decide_burst(base, state, counter, busy, policy)
        assert base <= got.quota_us <= base * max_quota / 100 + 1
        assert 0 <= got.burst_us <= got.quota_us
        if not policy.quota_on or busy > 50:
            assert got.quota_us == base
        if not policy.burst_on:
            assert got.burst_us == 0
        state = got.state
