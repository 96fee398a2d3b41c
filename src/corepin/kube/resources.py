"""The built-in resources corepin uses (the CRDs' resources live with their models)."""

from __future__ import annotations

from corepin.kube.client import Resource

NAMESPACES = Resource("", "v1", "namespaces", False, "Namespace")
NODES = Resource("", "v1", "nodes", False, "Node")
PODS = Resource("", "v1", "pods", True, "Pod")
CONFIGMAPS = Resource("", "v1", "configmaps", True, "ConfigMap")
EVENTS = Resource("", "v1", "events", True, "Event")
EVENTS_V1 = Resource("events.k8s.io", "v1", "events", True, "Event")
LEASES = Resource("coordination.k8s.io", "v1", "leases", True, "Lease")
CRDS = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", False, "CustomResourceDefinition"
)
