"""`corepin scheduler`, the second scheduler, and what it shares with the extender.

- `feed`       informers of NodeCPUTopologies, PodCPUBindings, pods (and nodes) feeding a
               `corepin.placement.cluster.Cluster`
- `scheduler`  the scheduling loop: pending pods with its scheduler name, filtered and scored
               on every node, bound through pods/binding (optionally with a PodCPUBinding of
               the exact CPUs first); leader-elected
- `nodes`      the node checks a scheduler makes besides CPUs (cordon, taints, node selector)
- `metrics`    Prometheus metrics of the scheduler and the extender
"""
