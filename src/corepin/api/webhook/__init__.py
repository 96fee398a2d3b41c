"""`corepin webhook`: the mutating and validating admission webhook for pods.

- `admission` the decisions: AdmissionReview v1 in, AdmissionReview v1 out (pure)
- `capacity`  whether any node of the cluster could ever hold a pod's CPUs, from the
              NodeCPUTopology objects the agents publish
- `tls`       the serving certificate and key, reloaded when their files change
- `server`    the HTTPS server: `POST /validate`, `POST /mutate`, `GET /healthz`, `GET /metrics`
- `metrics`   the webhook's Prometheus metrics
"""
