"""`corepin scheduler` and `corepin extender`: argument parsing and wiring.

The placement core is `corepin.placement`; the informers feeding it (`corepin.agent.cluster.
catalog`), the scheduling loop (`corepin.agent.cluster.scheduler`) and the metrics of both
(`corepin.agent.cluster.metrics`) are the cluster side's; the extender's HTTP side is
`corepin.api.extender`, which is handed the catalog and the metrics as its declared ports.
What `run` needs is imported when it runs: building the command line stays cheap.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from corepin.cli.common import add_kube_arguments, kube_config, stop_on_signals
from corepin.core.errors import InputError

if TYPE_CHECKING:
    from corepin.agent.cluster.catalog import PlacementFeed
    from corepin.agent.cluster.metrics import PlacementMetrics
    from corepin.api.webhook.tls import ServingCertificate
    from corepin.kube.client import KubeClient
    from corepin.placement.cluster import Cluster

PROFILES = ("MaximumUtilization", "Balanced")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _bytes(text: str) -> int:
    if not text.isdigit() or int(text) < 1024:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 1024, got {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_kube_arguments(parser)
    if name == "scheduler":
        parser.description = (
            "Run the second scheduler: place pending pods whose spec.schedulerName is "
            "--scheduler-name on nodes whose corepin agent can pin them, and bind them."
        )
        parser.add_argument(
            "--scheduler-name", metavar="NAME", default="corepin-scheduler",
            help="the pods' spec.schedulerName to place (default: corepin-scheduler)",
        )  # fmt: skip
        parser.add_argument(
            "--metrics-address", metavar="HOST:PORT", default=":9466",
            help="serves /healthz and /metrics over HTTP (default: :9466)",
        )  # fmt: skip
        parser.add_argument(
            "--bind-cpus",
            action="store_true",
            help="choose the exact CPUs and create the pod's PodCPUBinding before binding",
        )
        parser.add_argument(
            "--leader-elect-namespace",
            metavar="NAMESPACE",
            help="where the leader-election Lease lives (default: the kubeconfig's namespace)",
        )
    else:
        parser.description = (
            "Serve the kube-scheduler extender v1 (POST /filter, /prioritize, /bind, /preempt) "
            "on the nodes' published CPU topologies."
        )
        parser.add_argument(
            "--address", metavar="HOST:PORT", required=True,
            help="where to serve the extender's HTTP(S) API (required)",
        )  # fmt: skip
        parser.add_argument(
            "--max-body-bytes", metavar="N", type=_bytes, default=16 * 1024 * 1024,
            help="larger requests are refused with 413 (default: 16 MiB)",
        )  # fmt: skip
        parser.add_argument(
            "--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate (reread "
            "on change); needs --tls-key and --client-ca",
        )  # fmt: skip
        parser.add_argument("--tls-key", metavar="FILE", help="its PEM private key")
        parser.add_argument(
            "--client-ca", metavar="FILE", help="PEM CA bundle: every client (kube-scheduler) "
            "must present a certificate it signed",
        )  # fmt: skip
        parser.add_argument(
            "--insecure-http", action="store_true", help="serve plain HTTP without client "
            "authentication on purpose (development only: anyone who reaches the port can have "
            "pods bound); without it, plain HTTP (no TLS flags) is served with a warning",
        )  # fmt: skip
        parser.add_argument(
            "--scheduler-name", metavar="NAME", action="append", default=[],
            help="bind only pods whose spec.schedulerName is NAME (repeatable; default: "
            "default-scheduler, the profile of the shipped KubeSchedulerConfiguration)",
        )  # fmt: skip
        parser.add_argument(
            "--metrics-address", metavar="HOST:PORT", default="",
            help="also serve /healthz and /metrics over plain HTTP here, for probes and "
            "scrapes that have no client certificate (default: none)",
        )  # fmt: skip
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="MaximumUtilization",
        help="MaximumUtilization packs pods onto busy nodes, Balanced spreads them",
    )
    parser.add_argument(
        "--stale-after", metavar="SECONDS", type=_seconds, default=60.0,
        help="a node whose agent has not reported for this long takes no pinned pod (60)",
    )  # fmt: skip
    parser.add_argument(
        "--assume-ttl", metavar="SECONDS", type=_seconds, default=60.0,
        help="how long a placement counts before its node must show it (60)",
    )  # fmt: skip


def _connect(args: argparse.Namespace) -> KubeClient:
    """The API client, checked (exit 4 with one line when the API cannot be reached)."""
    from corepin.kube.client import KubeClient

    client = KubeClient.from_config(kube_config(args, dict(os.environ)))
    try:
        client.check()
    except BaseException:
        client.close()
        raise
    return client


def _until(done: threading.Event, tick: Callable[[], None]) -> None:
    while not done.wait(0.5):
        tick()


def _gauges(metrics: PlacementMetrics, cluster: Cluster, feed: PlacementFeed) -> Callable[[], None]:
    seen = [0]

    def tick() -> None:
        metrics.in_flight.set(len(cluster.ledger))
        metrics.nodes.set(len(cluster.names()))
        restarts = feed.watch_restarts
        if restarts > seen[0]:
            metrics.watch_restarts.inc(restarts - seen[0])
            seen[0] = restarts

    return tick


def _settle_heap() -> None:
    """Move what the first lists loaded (a cluster's worth of topologies and pods) out of the
    garbage collector's sight: a full collection over it would stall answers for a few hundred
    milliseconds at 1,000 nodes."""
    gc.collect()
    gc.freeze()


def run(args: argparse.Namespace) -> int:
    if args.command == "scheduler":
        return _run_scheduler(args)
    return _run_extender(args)


def _extender_tls(args: argparse.Namespace) -> ServingCertificate | None:
    """The extender's ServingCertificate (loaded: exit 4 naming a bad file), or None for plain
    HTTP: with --insecure-http, or with no TLS flag at all (the command line every version
    accepted; a warning says what it exposes). InputError (exit 2) for a partial TLS set-up or
    TLS flags beside --insecure-http."""
    files = {"--tls-cert": args.tls_cert, "--tls-key": args.tls_key, "--client-ca": args.client_ca}
    given = [flag for flag, value in files.items() if value]
    if args.insecure_http or not given:
        if given:
            raise InputError(
                f"--insecure-http serves plain HTTP: drop {', '.join(given)} (or drop "
                "--insecure-http to serve TLS)",
                reason="bad_flags",
            )
        if not args.insecure_http:
            print(
                "corepin extender: warning: serving plain HTTP without client authentication "
                "(anyone who reaches the port can have pods bound): give --tls-cert, --tls-key "
                "and --client-ca, or --insecure-http to say it is meant",
                file=sys.stderr,
            )
        return None
    missing = [flag for flag, value in files.items() if not value]
    if missing:
        raise InputError(
            f"the extender serves TLS with client certificates: give {', '.join(missing)} "
            "(or none of them and --insecure-http, for development only)",
            reason="bad_flags",
        )
    from corepin.api.webhook.tls import ServingCertificate

    certificate = ServingCertificate(args.tls_cert, args.tls_key, client_ca=args.client_ca)
    certificate.load()
    return certificate


def _run_extender(args: argparse.Namespace) -> int:
    from corepin.agent.cluster.catalog import PlacementFeed
    from corepin.agent.cluster.metrics import PlacementMetrics
    from corepin.api.extender.server import SCHEDULER_NAMES, ExtenderServer, ExtenderService
    from corepin.api.http import OpsServer, parse_address
    from corepin.placement.cluster import Cluster

    parse_address(args.address)  # a bad address is refused before the API is asked
    if args.metrics_address:
        parse_address(args.metrics_address)
    certificate = _extender_tls(args)
    done = stop_on_signals()
    client = _connect(args)
    cluster = Cluster(
        profile=args.profile, stale_after=args.stale_after, assume_ttl=args.assume_ttl
    )
    metrics = PlacementMetrics()
    feed = PlacementFeed(client, cluster, nodes=True)
    service = ExtenderService(
        cluster,
        feed,
        client,
        metrics=metrics,
        scheduler_names=tuple(args.scheduler_name) or SCHEDULER_NAMES,
    )
    server = ExtenderServer(
        service,
        args.address,
        ready=lambda: feed.synced,
        metrics=metrics.registry,
        max_body=args.max_body_bytes,
        tls=None if certificate is None else certificate.context,
    )
    ops = None
    if args.metrics_address:
        ops = OpsServer(args.metrics_address, metrics=metrics.registry, ready=lambda: feed.synced)
    server.start()
    try:
        if ops is not None:
            ops.start()
        feed.start()
        _settle_heap()
        _until(done, _gauges(metrics, cluster, feed))
    finally:
        server.stop(timeout=1.5)
        if ops is not None:
            ops.stop(timeout=1.0)
        feed.stop(timeout=1.5)
        client.close()
    return 0


def _run_scheduler(args: argparse.Namespace) -> int:
    from corepin.agent.cluster.scheduler.scheduler import Scheduler, SchedulerSettings
    from corepin.api.http import OpsServer, parse_address

    parse_address(args.metrics_address)
    done = stop_on_signals()
    client = _connect(args)
    settings = SchedulerSettings(
        name=args.scheduler_name,
        profile=args.profile,
        bind_cpus=bool(args.bind_cpus),
        stale_after=args.stale_after,
        assume_ttl=args.assume_ttl,
        lease_namespace=args.leader_elect_namespace or client.default_namespace or "default",
    )
    scheduler = Scheduler(client, settings)
    ops = OpsServer(args.metrics_address, metrics=scheduler.metrics.registry, ready=scheduler.ready)
    ops.start()
    try:
        scheduler.start()
        _settle_heap()
        _until(done, _gauges(scheduler.metrics, scheduler.cluster, scheduler.feed))
    finally:
        scheduler.stop(timeout=2.5)
        ops.stop(timeout=1.0)
        client.close()
    return 0
