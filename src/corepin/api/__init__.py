"""Surfaces: the servers corepin's long-running commands expose (imported on demand; this
package imports nothing).

- `http`  the small HTTP server every long-running command serves `GET /healthz` and
          `GET /metrics` (Prometheus text) on (CONTRACTS 7.1); `parse_address`
"""
