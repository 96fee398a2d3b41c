"""The policy registry: policy name -> Policy object.

Policies load on first use, so a policy module that fails to import (or is not built yet) only
affects requests that name it.
"""

from __future__ import annotations

import importlib
from typing import Final, cast

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
        try:
            module = importlib.import_module("corepin.allocation.kubelet_static")
        except ImportError as exc:
            raise RequestError(
                f"policy 'kubelet-static' is not available in this build ({exc})",
                reason="unknown_policy",
            ) from exc
        return cast(Policy, module.KubeletStaticPolicy())
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
