"""What the extender is handed, declared here so that it depends on no program's internals:
the cluster's catalog of nodes and pods it reads (`NodeCatalog`; `corepin extender` hands it
the informers of `corepin.agent.cluster.catalog`) and the metrics it counts into
(`ExtenderMetrics`; `corepin.agent.cluster.metrics.PlacementMetrics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from corepin.placement.request import PodRequest

#: a Kubernetes object as the API sends it (JSON)
KubeObject = Mapping[str, Any]


class NodeCatalog(Protocol):
    """The nodes and pods of the cluster as the informers last saw them."""

    def request_of(self, pod: KubeObject) -> PodRequest:
        """The pod's CPU request, planned with its PodCPUBinding as its node's agent plans it."""
        ...

    def cached_pod(self, name: str, namespace: str) -> KubeObject | None:
        """The pod as last seen (None: not seen)."""
        ...

    def cached_node(self, name: str) -> KubeObject | None:
        """The Node object as last seen (None: not seen, or nodes are not watched)."""
        ...


class ExtenderMetrics(Protocol):
    """The counters and timings of the extender's answers."""

    def timed(self, verb: str) -> AbstractContextManager[None]:
        """Times one answer to `verb`."""
        ...

    def request(self, verb: str, outcome: str) -> None:
        """One answer to `verb` (its HTTP status)."""
        ...

    def failed(self, reason: str, count: int = 1) -> None:
        """Nodes that did not pass a filter, by reason."""
        ...

    def binding(self, result: str) -> None:
        """One bind, by result (bound, refused, failed)."""
        ...


__all__ = ["ExtenderMetrics", "KubeObject", "NodeCatalog"]
