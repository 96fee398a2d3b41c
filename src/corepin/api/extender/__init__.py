"""`corepin extender`: the kube-scheduler extender v1.

- `wire`    the extender's JSON types both ways (Go field names, decoded case-insensitively)
- `server`  `ExtenderService` (filter, prioritize, bind, preempt on the placement core) and
            `ExtenderServer` (HTTP with body limits and timeouts, on `corepin.api.http`, which
            also serves its /healthz and /metrics)
- `ports`   what it is handed: the catalog of nodes and pods it reads (`NodeCatalog`) and the
            metrics it counts into (`ExtenderMetrics`)
"""
