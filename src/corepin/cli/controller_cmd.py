"""`corepin controller`: the cluster controller (what it does is in
`corepin.agent.cluster.controller`). This module only reads the command line and wires the parts:
API client, start-up check, leader-elected controller service, /healthz + /metrics server,
SIGTERM. Nothing heavy is imported before `run()`: building the command line (every
subcommand's, for `corepin --help`) loads no API, Kubernetes or agent module.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import uuid

from corepin.cli.common import add_kube_arguments, kube_config, positive_seconds
from corepin.core.errors import InputError

DEFAULT_METRICS_ADDRESS = ":9465"
DEFAULT_LEASE_NAME = "corepin-controller"
STOP_BUDGET = 4.0  # seconds for a clean stop after SIGTERM (the contract allows 5)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_kube_arguments(parser)
    parser.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        default=DEFAULT_METRICS_ADDRESS,
        help=f"serve GET /healthz and /metrics here (default {DEFAULT_METRICS_ADDRESS})",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        metavar="SECONDS",
        type=positive_seconds,
        default=60.0,
        help="mark a NodeCPUTopology Ready=False when its agent's heartbeat has not changed "
        "for this long (default 60)",
    )
    parser.add_argument(
        "--lease-namespace",
        metavar="NS",
        help="namespace of the leader-election Lease (default: the namespace of the "
        "kubeconfig context, or the pod's own namespace in the cluster)",
    )
    parser.add_argument(
        "--lease-name",
        metavar="NAME",
        default=DEFAULT_LEASE_NAME,
        help=f"name of the leader-election Lease (default {DEFAULT_LEASE_NAME})",
    )
    parser.add_argument(
        "--identity",
        metavar="ID",
        help="this replica's name in the Lease (default: host name plus a random suffix)",
    )
    timing = parser.add_argument_group("leader election timing (seconds)")
    timing.add_argument(
        "--lease-duration",
        metavar="SECONDS",
        type=positive_seconds,
        default=15.0,
        help="a standby takes over a Lease not renewed for this long (default 15)",
    )
    timing.add_argument(
        "--renew-deadline",
        metavar="SECONDS",
        type=positive_seconds,
        default=10.0,
        help="the leader stops acting when it could not renew for this long (default 10)",
    )
    timing.add_argument(
        "--retry-period",
        metavar="SECONDS",
        type=positive_seconds,
        default=2.0,
        help="how often to try to take or renew the Lease (default 2)",
    )


def _setup_logging(environ: dict[str, str]) -> None:
    """A server's logs are its report: info and above on stderr, key=value, unless
    COREPIN_LOG names another level. Never quieter than a set-up made before (-v)."""
    logger = logging.getLogger("corepin")
    wanted = environ.get("COREPIN_LOG", "").upper()
    named = wanted in ("DEBUG", "INFO", "WARNING", "ERROR")
    level: int = logging.getLevelName(wanted) if named else logging.INFO
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    if not any(isinstance(h, logging.StreamHandler) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
                "%Y-%m-%dT%H:%M:%S%z",
            )
        )
        logger.addHandler(handler)


def run(args: argparse.Namespace) -> int:
    if not args.lease_duration > args.renew_deadline > args.retry_period:
        raise InputError(
            "leader election needs --lease-duration > --renew-deadline > --retry-period "
            f"(got {args.lease_duration:g}, {args.renew_deadline:g}, {args.retry_period:g})",
            reason="bad_lease_timing",
        )
    if args.lease_name == "" or args.lease_namespace == "" or args.identity == "":
        raise InputError("--lease-name, --lease-namespace and --identity must not be empty")

    from corepin.api.http import OpsServer, parse_address

    parse_address(args.metrics_address)  # a bad address is refused before anything starts
    _setup_logging(dict(os.environ))

    from corepin.agent.cluster.controller.controller import ControllerSettings
    from corepin.agent.cluster.controller.service import ControllerService, check_api
    from corepin.kube.client import KubeClient

    config = kube_config(args, os.environ)
    client = KubeClient.from_config(
        config, timeout=10.0, user_agent="corepin-controller", field_manager="corepin-controller"
    )
    lease_namespace = args.lease_namespace or client.default_namespace
    try:
        check_api(client, lease_namespace)
        identity = args.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        service = ControllerService(
            client,
            ControllerSettings(heartbeat_timeout=args.heartbeat_timeout),
            lease_namespace=lease_namespace,
            lease_name=args.lease_name,
            identity=identity,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
        server = OpsServer(
            args.metrics_address,
            metrics=service.metrics.registry,
            ready=lambda: service.health()[0],
        )
        server.start()
    except BaseException:
        client.close()
        raise

    stop = threading.Event()

    def request_stop(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        service.start()
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        service.stop(STOP_BUDGET - 0.5)
        server.stop(0.4)
        client.close()
    return 0
