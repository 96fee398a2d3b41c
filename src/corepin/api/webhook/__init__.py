"""`corepin webhook`: the mutating and validating admission webhook for pods (and the
validating one for CPUReservations).

- `admission` the decisions: AdmissionReview v1 in, AdmissionReview v1 out (pure), by
              `validate` (what is refused or warned about) and `mutate` (the JSONPatch, built
              by `patch`); `reservations` judges CPUReservations; `review` is the
              AdmissionReview wire format, `config` the flags
- `capacity`  whether any node of the cluster could ever hold a pod's CPUs, from the
              NodeCPUTopology objects the agents publish (the fit is `corepin.placement`'s)
- `tls`       the serving certificate and key, reloaded when their files change
- `server`    the HTTPS server: `POST /validate`, `POST /mutate`, `GET /healthz`, `GET /metrics`
- `metrics`   the webhook's Prometheus metrics
- `app`       the endpoints: request bodies to answers, counted
"""
