"""The node QoS policy: what a file (`--qos-config`) or the `corepin-qos` ConfigMap says.

```yaml
classes:                 # per QoS class: its share of the L3 ways and memory bandwidth
  BE: {resctrl: {l3Percent: [0, 30], mbaPercent: 100}}
beSuppress: {policy: cpuset, sloPercent: 65, minCPUs: 2}   # cpuset | cfsQuota | off
cpuBurst: {policy: none, burstPercent: 1000, maxQuotaPercent: 300, shareUsageLimitPercent: 50}
beCPUIdle: false
```

Every key may be left out (its default stays). A value that is not what the field takes is
refused with an InputError naming the field (`beSuppress.sloPercent: 150 is outside 1..100`),
so a caller keeps its old policy. `QosPolicy.to_json()` gives the whole effective policy back,
in the same shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from corepin.core.errors import InputError
from corepin.core.qos import CLASSES

__all__ = [
    "BE_SUPPRESS_POLICIES",
    "BURST_POLICIES",
    "BeSuppress",
    "ClassPolicy",
    "CpuBurst",
    "QosPolicy",
    "default_class_policies",
    "parse_class_policies",
    "parse_policy",
    "parse_policy_text",
]

BE_SUPPRESS_POLICIES: Final = ("cpuset", "cfsQuota", "off")
BURST_POLICIES: Final = ("none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto")
_REASON: Final = "bad_qos_policy"


def _refuse(message: str) -> InputError:
    return InputError(message, reason=_REASON)


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    """One class's share: L3 ways as a percent range, memory bandwidth as a percent."""

    l3_percent: tuple[int, int] | None = None
    mba_percent: int | None = None

    def to_json(self) -> dict[str, Any]:
        resctrl: dict[str, Any] = {}
        if self.l3_percent is not None:
            resctrl["l3Percent"] = list(self.l3_percent)
        if self.mba_percent is not None:
            resctrl["mbaPercent"] = self.mba_percent
        return {"resctrl": resctrl}


@dataclass(frozen=True, slots=True)
class BeSuppress:
    """How best-effort work is squeezed: `policy`, the share of the node's CPUs the node may
    be busy up to (`slo_percent`), and the fewest CPUs BE keeps (`min_cpus`)."""

    policy: str = "cpuset"
    slo_percent: int = 65
    min_cpus: int = 2

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "sloPercent": self.slo_percent, "minCPUs": self.min_cpus}


@dataclass(frozen=True, slots=True)
class CpuBurst:
    """CPU burst of LS containers with a limit (see `corepin.allocation.qos.burst`)."""

    policy: str = "none"
    burst_percent: int = 1000
    max_quota_percent: int = 300
    share_usage_limit_percent: int = 50

    @property
    def burst_on(self) -> bool:
        """Whether the kernel's burst allowance (cfs_burst_us, cpu.max.burst) is used."""
        return self.policy in ("cpuBurstOnly", "auto")

    @property
    def quota_on(self) -> bool:
        """Whether the CFS quota itself is raised while throttled."""
        return self.policy in ("cfsQuotaBurstOnly", "auto")

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "burstPercent": self.burst_percent,
            "maxQuotaPercent": self.max_quota_percent,
            "shareUsageLimitPercent": self.share_usage_limit_percent,
        }


def default_class_policies() -> dict[str, ClassPolicy]:
    """BE gets L3 0-30 %, every other class 0-100 %; MBA 100 % for all."""
    return {
        name: ClassPolicy(l3_percent=(0, 30) if name == "BE" else (0, 100), mba_percent=100)
        for name in CLASSES
    }


@dataclass(frozen=True, slots=True)
class QosPolicy:
    """The whole node QoS policy (defaults as documented in the module docstring)."""

    classes: Mapping[str, ClassPolicy] = field(default_factory=default_class_policies)
    be_suppress: BeSuppress = field(default_factory=BeSuppress)
    cpu_burst: CpuBurst = field(default_factory=CpuBurst)
    be_cpu_idle: bool = False

    def class_policy(self, name: str) -> ClassPolicy:
        return self.classes.get(name) or default_class_policies()[name]

    def to_json(self) -> dict[str, Any]:
        return {
            "classes": {name: self.class_policy(name).to_json() for name in CLASSES},
            "beSuppress": self.be_suppress.to_json(),
            "cpuBurst": self.cpu_burst.to_json(),
            "beCPUIdle": self.be_cpu_idle,
        }


# ---------------------------------------------------------------------- parsing
def _whole(value: object, where: str, low: int, high: int | None = 100) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(f"{where}: {value!r} is not a whole number")
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f"at least {low}"
        raise _refuse(f"{where}: {value} is outside {bound}")
    return value


def _mapping(value: object, where: str, fields: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _refuse(f"{where}: expected a mapping with {', '.join(fields)}, got {value!r}")
    unknown = sorted(str(k) for k in value if k not in fields)
    if unknown:
        raise _refuse(f"{where}.{unknown[0]}: unknown field (known: {', '.join(fields)})")
    return value


def _choice(value: object, where: str, choices: tuple[str, ...]) -> str:
    if value is False and "off" in choices:
        return "off"  # YAML 1.1 (PyYAML) reads a bare `off` as false
    if not isinstance(value, str) or value not in choices:
        hint = " (YAML reads a bare on/off/yes/no as true/false)" if isinstance(value, bool) else ""
        raise _refuse(f"{where}: {value!r} is not one of {', '.join(choices)}{hint}")
    return value


def parse_class_policies(data: object, *, where: str = "classes") -> dict[str, ClassPolicy]:
    """`{CLASS: {resctrl: {l3Percent: [s, e], mbaPercent: N}}}` -> the policies of the classes
    named (the others keep their defaults), refusing anything else by field name."""
    if not isinstance(data, Mapping):
        raise _refuse(f"{where}: expected a mapping of QoS class to settings, got {data!r}")
    out = default_class_policies()
    for name, body in data.items():
        here = f"{where}.{name}"
        if name not in CLASSES:
            raise _refuse(f"{here}: unknown QoS class (one of {', '.join(CLASSES)})")
        resctrl = _mapping(body, here, ("resctrl",)).get("resctrl", {})
        here = f"{here}.resctrl"
        resctrl = _mapping(resctrl, here, ("l3Percent", "mbaPercent"))
        l3: tuple[int, int] | None = out[name].l3_percent
        if "l3Percent" in resctrl:
            spot = f"{here}.l3Percent"
            pair = resctrl["l3Percent"]
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise _refuse(f"{spot}: expected [start, end] percent, got {pair!r}")
            start, end = _whole(pair[0], spot, 0), _whole(pair[1], spot, 0)
            if start >= end:
                raise _refuse(f"{spot}: start {start} must be below end {end}")
            l3 = (start, end)
        mba = out[name].mba_percent
        if "mbaPercent" in resctrl:
            mba = _whole(resctrl["mbaPercent"], f"{here}.mbaPercent", 1)
        out[str(name)] = ClassPolicy(l3_percent=l3, mba_percent=mba)
    return out


def _be_suppress(data: object) -> BeSuppress:
    here = "beSuppress"
    body = _mapping(data, here, ("policy", "sloPercent", "minCPUs"))
    base = BeSuppress()
    return BeSuppress(
        policy=_choice(body.get("policy", base.policy), f"{here}.policy", BE_SUPPRESS_POLICIES),
        slo_percent=_whole(body.get("sloPercent", base.slo_percent), f"{here}.sloPercent", 1),
        min_cpus=_whole(body.get("minCPUs", base.min_cpus), f"{here}.minCPUs", 1, None),
    )


def _cpu_burst(data: object) -> CpuBurst:
    here = "cpuBurst"
    names = ("policy", "burstPercent", "maxQuotaPercent", "shareUsageLimitPercent")
    body = _mapping(data, here, names)
    base = CpuBurst()
    return CpuBurst(
        policy=_choice(body.get("policy", base.policy), f"{here}.policy", BURST_POLICIES),
        burst_percent=_whole(
            body.get("burstPercent", base.burst_percent), f"{here}.burstPercent", 1, None
        ),
        max_quota_percent=_whole(
            body.get("maxQuotaPercent", base.max_quota_percent),
            f"{here}.maxQuotaPercent",
            100,
            None,
        ),
        share_usage_limit_percent=_whole(
            body.get("shareUsageLimitPercent", base.share_usage_limit_percent),
            f"{here}.shareUsageLimitPercent",
            1,
        ),
    )


def parse_policy(data: object) -> QosPolicy:
    """A `QosPolicy` from parsed YAML/JSON (None or {} is the default policy)."""
    if data is None:
        return QosPolicy()
    body = _mapping(data, "policy", ("classes", "beSuppress", "cpuBurst", "beCPUIdle"))
    idle = body.get("beCPUIdle", False)
    if not isinstance(idle, bool):
        raise _refuse(f"beCPUIdle: {idle!r} is not true or false")
    return QosPolicy(
        classes=(
            parse_class_policies(body["classes"]) if "classes" in body else default_class_policies()
        ),
        be_suppress=_be_suppress(body["beSuppress"]) if "beSuppress" in body else BeSuppress(),
        cpu_burst=_cpu_burst(body["cpuBurst"]) if "cpuBurst" in body else CpuBurst(),
        be_cpu_idle=idle,
    )


def parse_policy_text(text: str, source: str) -> QosPolicy:
    """A policy from YAML or JSON text; `source` (a file name, `ConfigMap ns/name`) prefixes
    every error."""
    try:
        data = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise _refuse(f"{source}: not YAML or JSON{at}: {getattr(err, 'problem', err)}") from None
    try:
        return parse_policy(data)
    except InputError as err:
        raise _refuse(f"{source}: {err.message}") from None
