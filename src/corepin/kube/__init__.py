"""The Kubernetes API boundary: the one client every corepin component uses.

Modules (import them directly; this package imports nothing, so `corepin --help` never loads
http, ssl or json parsing of API objects):

- `config`    where the API is and who corepin is to it: --kubeconfig/--context, $KUBECONFIG,
              ~/.kube/config or the in-cluster service account, read by the official
              client library's loaders (exec plugins, auth providers, proxies)
- `transport` HTTP(S) over `http.client` + `ssl`, keep-alive pool, cancellation
- `client`    `KubeClient`: generic get/list/create/replace/patch/delete/status/bind/watch on
              any `Resource(group, version, plural, namespaced)`
- `errors`    `api_error` maps every failed answer to the typed errors of
              `corepin.core.errors` (ApiError and its subclasses; the transport raises
              ApiUnreachable for socket/TLS failures) - the one mapping place
- `watch`     an open watch and its events
- `resources` every resource corepin touches (pods, nodes, events, leases, its CRDs, ...)
- `models`    the wire format: corepin's CRDs and annotations, typed views of API objects
- `podplan`   what a pod asks of corepin, read once for the agent and the placement core
- `informer`  list + watch into a cache, handlers, relist on 410, backoff, counters
- `events`    core/v1 Event recorder with count aggregation
- `leader`    Lease-based leader election
- `workqueue` deduplicated work queue with delayed and rate-limited adds (controllers)
- `eviction`  one Eviction API call (`pods/eviction`, PodDisruptionBudgets honoured by the
              server): evicted, gone, or refused with the server's reason, never retried here

Why a small client of our own over the standard library rather than lightkube: what corepin
needs from the API is narrow (generic JSON objects, a handful of verbs, watch) and the parts
where libraries differ most are exactly the ones the node agent depends on: control of the
watch (every restart, 410 and bookmark visible so the informer can count restarts and relist;
lightkube's watch retries on its own), cancelling a blocked watch from another thread for a
bounded stop, and one place where failures become corepin errors. The standard library does
it with no dependency in the agent's image and a cheaper import than httpx + anyio + the
generated models; corepin's own CRD models and dict access cover the typing.
"""
