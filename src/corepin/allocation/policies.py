"""The policy registry: policy name -> Policy object.

Policies load on first use: `corepin run` pays for the import of the one policy it uses (the
kubelet-static module alone is over a thousand lines).
"""

from __future__ import annotations

from typing import Final

from corepin.allocation.types import Policy
from corepin.core.errors import RequestError

#: Every policy name, the default first.
POLICY_NAMES: Final[tuple[str, ...]] = ("topology-aware", "kubelet-static", "workload-aware")
DEFAULT_POLICY: Final = "topology-aware"

_cache: dict[str, Policy] = {}


def _load(name: str) -> Policy:
    if name == "topology-aware":
        from corepin.allocation.topology_aware import TopologyAwarePolicy

        return TopologyAwarePolicy()
    if name == "workload-aware":
        from corepin.allocation.workload_aware import WorkloadAwarePolicy

        return WorkloadAwarePolicy()
    if name == "kubelet-static":
        from corepin.allocation.kubelet_static import KubeletStaticPolicy

        return KubeletStaticPolicy()
    raise RequestError(
        f"unknown policy {name!r} (choose from {', '.join(POLICY_NAMES)})",
        reason="unknown_policy",
    )


def get_policy(name: str) -> Policy:
    """The policy called `name`; RequestError naming it when there is no such policy."""
    if not isinstance(name, str):
        raise RequestError(f"policy name must be a string, got {name!r}", reason="unknown_policy")
    policy = _cache.get(name)
    if policy is None:
        policy = _load(name)
        _cache[name] = policy
    return policy
