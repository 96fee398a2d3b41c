"""`corepin scheduler`, the second scheduler.

- `scheduler`     the scheduling loop: pending pods with its scheduler name, filtered and scored
                  on every node, bound through pods/binding; leader-elected
- `pending`       which pod is scheduled next: the queue, unschedulable pods parked until the
                  cluster changes, failed ones retried with a backoff
- `cpu_bindings`  `--bind-cpus`: the PodCPUBinding of the exact CPUs chosen, created before the
                  bind

What it shares with the extender is one level up: the informers feeding the placement core
(`corepin.agent.cluster.catalog`) and the metrics (`corepin.agent.cluster.metrics`).
"""
