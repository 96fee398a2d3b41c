"""`corepin webhook`: the admission webhook for pods.

Argument parsing and wiring only: the decisions are `corepin.api.webhook.admission`, the
HTTPS server `corepin.api.webhook.server`.

The API is optional. With `--kubeconfig` (or `$KUBECONFIG`) it must answer at start (exit 4
otherwise); in a cluster the service account is used and the API may come later; with neither,
the webhook runs without it. Through the API it watches NodeCPUTopologies for the rule "no
node could ever hold this pod"; without them that rule is skipped.

(The webhook's own modules are imported in the functions that use them: `corepin --help`
loads this module, and must not load the API, the kube client or TLS.)
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from corepin.cli.common import (
    KUBECONFIG_DEFAULTS,
    add_kube_arguments,
    kube_config,
    stop_on_signals,
)
from corepin.core.errors import InputError, KubeConfigError

if TYPE_CHECKING:
    from corepin.api.webhook.config import WebhookConfig
    from corepin.kube.client import KubeClient


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "Serve the admission webhook for pods over HTTPS: POST /validate refuses malformed "
        "corepin annotations, ineligible exclusive/share containers and requests no node could "
        "ever hold; POST /mutate tells exclusive/share containers their CPUs (COREPIN_NUM_CPUS, "
        "a read-only mount of the agent's assignment files at /etc/corepin) and steers pods to "
        "corepin nodes. GET /healthz and /metrics on the same port."
    )
    add_kube_arguments(
        parser,
        kubeconfig_help=f"default: {KUBECONFIG_DEFAULTS}, else no API (the capacity rule is off)",
    )
    parser.add_argument(
        "--address", metavar="HOST:PORT", required=True, help="where to serve HTTPS (':9443')"
    )
    parser.add_argument(
        "--tls-cert", metavar="FILE", required=True, help="PEM certificate (reread on change)"
    )
    parser.add_argument(
        "--tls-key", metavar="FILE", required=True, help="PEM private key (reread on change)"
    )
    parser.add_argument(
        "--scheduler-name",
        metavar="NAME",
        default="",
        help="set spec.schedulerName of pods that ask corepin for CPUs (default: leave it)",
    )
    parser.add_argument(
        "--assignment-dir-host",
        metavar="PATH",
        default="/run/corepin/assignments",
        help="the agent's --assignment-dir on the nodes, mounted at /etc/corepin "
        "(default: /run/corepin/assignments; '' mounts nothing)",
    )
    parser.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="add this node selector to pods that ask corepin for CPUs (repeatable)",
    )
    parser.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="add this toleration to pods that ask corepin for CPUs (repeatable; EFFECT: "
        "NoSchedule, PreferNoSchedule or NoExecute, none for all)",
    )


def config_from(args: argparse.Namespace) -> WebhookConfig:
    """The WebhookConfig of the parsed arguments (InputError, exit 2, for a bad flag)."""
    from corepin.api.webhook.config import (
        WebhookConfig,
        parse_node_selector,
        parse_toleration,
    )

    selector = [parse_node_selector(text) for text in args.node_selector]
    seen: dict[str, str] = {}
    for key, value in selector:
        if seen.setdefault(key, value) != value:
            raise InputError(
                f"--node-selector {key} is given twice with different values",
                reason="bad_flag",
            )
    return WebhookConfig(
        scheduler_name=args.scheduler_name,
        assignment_dir_host=args.assignment_dir_host,
        node_selector=tuple(seen.items()),
        tolerations=tuple(dict.fromkeys(parse_toleration(t) for t in args.toleration)),
    )


def connect(args: argparse.Namespace, environ: dict[str, str]) -> KubeClient | None:
    """A KubeClient, or None when there is no kubeconfig and no in-cluster account. A given
    kubeconfig (--kubeconfig, --context or $KUBECONFIG) must work now: KubeConfigError /
    ApiUnreachable / ApiError (exit 4) otherwise."""
    import logging

    from corepin.kube.client import KubeClient

    given = bool(args.kubeconfig or args.context or environ.get("KUBECONFIG"))
    try:
        config = kube_config(args, environ)
    except KubeConfigError as exc:
        if given:
            raise
        logging.getLogger("corepin.cli.webhook").info(
            "event=no_api reason=%r (the capacity rule is off)", str(exc)
        )
        return None
    client = KubeClient.from_config(config, timeout=10.0, user_agent="corepin-webhook")
    if given:
        try:
            client.check()
        except BaseException:
            client.close()
            raise
    return client


def run(args: argparse.Namespace) -> int:
    from corepin.api.http import OpsServer
    from corepin.api.webhook.app import AdmissionApp
    from corepin.api.webhook.capacity import Catalog
    from corepin.api.webhook.metrics import WebhookMetrics
    from corepin.api.webhook.server import HttpsServer
    from corepin.api.webhook.tls import ServingCertificate
    from corepin.kube.informer import Informer
    from corepin.kube.resources import NCPT

    environ = dict(os.environ)
    config = config_from(args)
    metrics = WebhookMetrics()
    certificate = ServingCertificate(args.tls_cert, args.tls_key, on_reload=metrics.tls_reload)
    certificate.load()  # a bad file is refused (exit 4, naming it) before the API is asked
    catalog = Catalog()
    metrics.node_topologies.set_function(lambda: len(catalog))
    app = AdmissionApp(config, capacity=catalog.snapshot, metrics=metrics)
    ops = OpsServer(args.address, metrics=metrics.registry, ready=True)  # its pages only
    server = HttpsServer(args.address, certificate, routes=app.routes(), pages=ops.page)
    client = connect(args, environ)
    informer = None
    if client is not None:
        informer = Informer(client, NCPT, name="webhook-ncpt")
        informer.add_handlers(
            on_add=catalog.on_add, on_update=catalog.on_update, on_delete=catalog.on_delete
        )
    done = stop_on_signals()
    try:
        server.start()
        if informer is not None:
            informer.start()
        while not done.wait(1.0):
            pass
    finally:
        if informer is not None:
            informer.stop(timeout=1.5)
        server.stop(timeout=2.0)
        if client is not None:
            client.close()
    return 0
