"""The surfaces of the long-running commands, between the command line and the agents.

- `grpc`    the node gRPC API: server, typed client, message conversions;
            its protobuf modules are generated at build time from `proto/` (setup.py)
- `metrics` the agent's Prometheus metrics, one registry per process
- `http`    the small HTTP server of `GET /healthz` and `GET /metrics`

Nothing here is imported on the start-up path of `corepin --help` or `corepin run`: grpc,
protobuf and prometheus_client load only for the commands that serve or query them.
"""
