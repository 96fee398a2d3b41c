"""What a pod asks of the node agent: `corepin.kube.podplan`, named here for the agent's modules.

The plan of a pod is read by the node agent, the placement core (scheduler and extender) and the
webhook alike, so it lives below them all, beside the API models it reads; this module only
re-exports it.
"""

from __future__ import annotations

from corepin.kube.podplan import QOS, RUNTIMES, ContainerPlan, PodPlan, plan_pod, qos_class

__all__ = ["QOS", "RUNTIMES", "ContainerPlan", "PodPlan", "plan_pod", "qos_class"]
