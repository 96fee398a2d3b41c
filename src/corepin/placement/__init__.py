"""Placement: pure fit and score of pods on the nodes' published topologies.

One core shared by `corepin scheduler` (the second scheduler) and `corepin extender` (the
kube-scheduler extender): a node passes exactly when its node agent would be able to pin the
pod there, because the core runs the agent's own plan (`corepin.kube.podplan.plan_pod`) and
the agent's own decision (`corepin.allocation.decide.decide` with `keep_shared`, the policy the
node publishes) on the node's pools as its `NodeCPUTopology` publishes them.

Modules (pure: no file, socket or clock access; the time is passed in):

- `request`  `PodRequest`, what a pod asks for, from its plan (`pod_request(pod, binding)`)
- `node`     `NodeView`, a node's published `NodeCPUTopology` as pools the allocator takes
- `fit`      `fit(view, request, pools)`: every container in order, as the agent decides them
- `score`    `score(...)`: 0-100 by profile (`MaximumUtilization` packs, `Balanced` spreads)
             and workload family; `extender_score` scales to the extender's 0-10
- `ledger`   in-flight accounting: placements assumed until the node publishes them
- `cluster`  `Cluster`: the views, the ledger and cached fits behind one lock - what the
             scheduler and the extender ask (`filter`, `prioritize`, `assume`)

Nothing here imports the Kubernetes client: the informers that feed a `Cluster` live with the
commands (`corepin.agent.cluster.scheduler`).
"""
