"""Every API resource corepin reads or writes, defined once: the built-in ones and corepin's CRDs.

(The CRDs' names, groups and kinds are the wire format's, in `corepin.kube.models`; the models
stay pure, so the `Resource` values that the client needs are built here.)
"""

from __future__ import annotations

from corepin.kube.client import Resource
from corepin.kube.models import (
    CPUR_KIND,
    CPUR_PLURAL,
    GROUP,
    NCPT_KIND,
    NCPT_PLURAL,
    NRT_GROUP,
    NRT_KIND,
    NRT_PLURAL,
    PCB_KIND,
    PCB_PLURAL,
    VERSION,
)

#: corepin's NodeCPUTopology (cluster-scoped, one per node) and PodCPUBinding (namespaced).
NCPT = Resource(GROUP, VERSION, NCPT_PLURAL, False, NCPT_KIND)
PCB = Resource(GROUP, VERSION, PCB_PLURAL, True, PCB_KIND)
#: corepin's CPUReservation (cluster-scoped): CPUs held on a node for pods yet to come.
CPUR = Resource(GROUP, VERSION, CPUR_PLURAL, False, CPUR_KIND)
#: The Eviction API (a pod's `eviction` subresource) honours PodDisruptionBudgets.
PDBS = Resource("policy", "v1", "poddisruptionbudgets", True, "PodDisruptionBudget")
#: The community NodeResourceTopology (v1alpha2) the agent also publishes.
NRT = Resource(NRT_GROUP, "v1alpha2", NRT_PLURAL, False, NRT_KIND)

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
