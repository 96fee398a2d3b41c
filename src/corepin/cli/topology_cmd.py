"""`corepin topology`: what the machine looks like.

Sysfs fallbacks (missing files) and how discovery read files that disagree with each other (AMD
compute units, caches over several packages, ...) are logged, and shown with `corepin -v` or
COREPIN_LOG=info."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from corepin.cli.common import (
    add_output_argument,
    add_topology_source,
    dump,
    list_machines,
    load_topology,
    write_output,
)
from corepin.core.errors import InputError

if TYPE_CHECKING:
    from corepin.topology.model import Topology

FORMATS = ("table", "tree", "json", "yaml", "svg")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_topology_source(parser, machine=True)
    add_output_argument(
        parser,
        formats=FORMATS,
        help="table (default: one row per physical core), tree (pool tree), json, yaml, "
        "or svg (a picture of the machine)",
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        default=None,
        help="write to FILE instead of standard output",
    )
    parser.add_argument(
        "--title",
        default=None,
        help="heading of the svg picture (default: 'corepin topology')",
    )


def render(topology: Topology, fmt: str, *, title: str | None = None) -> str:
    """The text of `corepin topology -o fmt` for `topology`."""
    if fmt == "table":
        from corepin.cli.render.table import render_table

        return render_table(topology)
    if fmt == "tree":
        from corepin.cli.render.tree import render_tree

        return render_tree(topology)
    if fmt == "svg":
        from corepin.cli.render.svg import render_svg

        return render_svg(topology, title=title)
    return dump(topology.to_json(), fmt)


def run(args: argparse.Namespace) -> int:
    if list_machines(args):
        return 0
    if args.title is not None and args.output != "svg":
        raise InputError(
            f"--title {args.title!r} heads an svg picture; it does nothing with -o "
            f"{args.output}: add -o svg or drop --title",
            reason="bad_usage",
        )
    topology = load_topology(args)
    write_output(render(topology, args.output, title=args.title), args.out)
    return 0
