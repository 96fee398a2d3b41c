"""`corepin extender`: the kube-scheduler extender v1.

- `wire`    the extender's JSON types both ways (Go field names, decoded case-insensitively)
- `server`  `ExtenderService` (filter, prioritize, bind, preempt on the placement core) and
            `ExtenderServer` (HTTP with body limits and timeouts, /healthz, /metrics)
"""
