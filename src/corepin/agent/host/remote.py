"""`corepin report --node NAME`: a Kubernetes node's state read from its `NodeCPUTopology`.

(A running agent's state, `corepin report --agent SOCKET`, is read over gRPC by the command
itself: the gRPC client is a surface, above the agents.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corepin.core.errors import ApiNotFound, EnvironmentProblem, InputError
from corepin.kube.client import KubeClient
from corepin.kube.config import ClusterConfig
from corepin.kube.models import NodeCPUTopology
from corepin.kube.nodestate import NodeReport, node_state
from corepin.kube.resources import NCPT

if TYPE_CHECKING:
    from corepin.topology.model import Topology


def read_node(name: str, config: ClusterConfig) -> tuple[NodeReport, Topology]:
    """The node's report and topology from its NodeCPUTopology, read from the API `config`
    names."""
    client = KubeClient.from_config(config, timeout=15)
    try:
        obj = client.get(NCPT, name)
    except ApiNotFound as exc:
        if exc.details.get("name") != name:  # the type itself is not served
            raise EnvironmentProblem(
                f"the API server does not serve {NCPT} ({exc.api_message}): "
                "are corepin's CRDs installed (deploy/crd)?",
                reason="no_crd",
            ) from None
        raise InputError(
            f"node {name!r} has no NodeCPUTopology: is the corepin agent running on it?",
            reason="no_such_node",
        ) from None
    finally:
        client.close()
    ncpt = NodeCPUTopology.from_dict(obj)
    return node_state(ncpt), ncpt.spec.topology
