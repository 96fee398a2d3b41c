"""`corepin migrate`: move a node from the kubelet's static CPU manager to corepin.

```
corepin migrate --from-kubelet FILE [--state-dir DIR] [--sysfs-root DIR | --topology FILE]
                [--dry-run] [--force] [-o table|json|yaml]
corepin migrate --quarantine [--state-dir DIR] [--force] [-o table|json|yaml]
```

Argument parsing and output only; the work happens in `corepin.agent.host.migrate`. Building
the parser loads no agent module (`--help` and the other subcommands stay cheap): the command's
imports inside `run` stay there on purpose.

The state is written for the live topology (this machine's sysfs, or `--sysfs-root DIR`), the
one `corepin run`, `report` and `reconcile` check it against. `--topology FILE` previews an
import for another machine shape with `--dry-run`; without `--dry-run` the file must describe
the live machine (a state written for another shape would be refused by every later command).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from corepin.cli.common import (
    add_output_argument,
    add_state_arguments,
    add_topology_source,
    load_topology,
    render_output,
    write_output,
)
from corepin.core.errors import InputError

if TYPE_CHECKING:
    from corepin.agent.host.migrate import MigrationResult, QuarantineResult
    from corepin.agent.host.settings import HostSettings
    from corepin.topology.model import Topology


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.usage = (
        "corepin migrate --from-kubelet FILE [--state-dir DIR] "
        "[--sysfs-root DIR | --topology FILE] [--dry-run] [--force] [-o table|json|yaml]\n"
        "       corepin migrate --quarantine [--state-dir DIR] [--force] [-o table|json|yaml]"
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--from-kubelet",
        metavar="FILE",
        help="the kubelet's checkpoint to import (usually /var/lib/kubelet/cpu_manager_state)",
    )
    what.add_argument(
        "--quarantine",
        action="store_true",
        help="rename a corrupt corepin checkpoint aside (state.json.corrupt-<time>) so that "
        "corepin can start from an empty state",
    )
    add_state_arguments(
        parser,
        cgroups_help="look up the imported containers' cpuset cgroups: auto (default: when a "
        "cgroup v1 cpuset hierarchy is there), on (required), off; env COREPIN_CGROUPS",
    )
    add_topology_source(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be written; write nothing",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace a state that already holds allocations (with --quarantine: move aside "
        "a checkpoint that is not corrupt)",
    )
    add_output_argument(parser)


def run(args: argparse.Namespace) -> int:
    from corepin.agent.host.migrate import migrate_from_kubelet, quarantine
    from corepin.agent.host.settings import HostSettings

    settings = HostSettings.from_args(args, os.environ)
    if args.quarantine:
        given = [
            option
            for option, value in (
                ("--topology", args.topology),
                ("--sysfs-root", args.sysfs_root),
                ("--dry-run", args.dry_run or None),
                ("--cgroups", args.cgroups),
                ("--cgroup-root", args.cgroup_root),
            )
            if value is not None
        ]
        if given:
            raise InputError(
                f"--quarantine takes only --state-dir, --force and -o, not {', '.join(given)}",
                reason="bad_usage",
            )
        moved = quarantine(settings, force=args.force)
        write_output(
            render_output(args.output, moved.to_json(), lambda: _quarantine_text(moved)), None
        )
        return 0
    topology = _topology(args, settings)
    result = migrate_from_kubelet(
        settings, topology, args.from_kubelet, dry_run=args.dry_run, force=args.force
    )
    write_output(render_output(args.output, result.to_json(), lambda: _result_text(result)), None)
    return 0


def _topology(args: argparse.Namespace, settings: HostSettings) -> Topology:
    """The topology to import for: --topology FILE (which must be the live machine unless this
    is a dry run), else the machine under --sysfs-root (default /)."""
    topology = load_topology(args)
    if args.topology and not args.dry_run:
        from corepin.state.model import fingerprint
        from corepin.topology.discover import discover

        live = discover(settings.sysfs_root)
        if fingerprint(live) != fingerprint(topology):
            raise InputError(
                f"topology file {args.topology!r} (online CPUs {topology.online_cpus}) does not "
                f"describe this machine (online CPUs {live.online_cpus}); `corepin run`, `report` "
                "and `reconcile` check the state against the live topology and would refuse a "
                "state written for it. Preview with --dry-run, or drop --topology to import for "
                "this machine",
                reason="topology_not_live",
            )
    return topology


def _result_text(result: MigrationResult) -> str:
    data = result.to_json()
    checked = "verified" if data["verified"] else "no checksum (0)"
    lines = [
        f"kubelet checkpoint: {data['source']} (format {data['format']}, policy "
        f"{data['policy']}, checksum {data['checksum']}: {checked})",
    ]
    if result.written:
        lines.append(f"written to: {data['state_dir']} (revision {data['revision']})")
    else:
        lines.append(f"dry run: nothing written to {data['state_dir']}")
    rows = [("ID", "CPUS", "MEMS", "CGROUP")]
    for a in data["assignments"]:
        rows.append((a["id"], a["cpus"], a["mems"] or "-", a["cgroup"] or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines.append("")
    lines.extend(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
    if len(rows) == 1:
        lines.append("(no assignments)")
    lines.append("")
    lines.append(f"shared pool: {data['shared_pool'] or '(empty)'}")
    strict = " (strict-cpu-reservation)" if "strict-cpu-reservation" in data["options"] else ""
    lines.append(f"reserved:    {data['reserved'] or '(none)'}{strict}")
    lines.append(f"free:        {data['free'] or '(none)'}")
    if data["notes"]:
        lines.append("")
        lines.append("notes:")
        lines.extend(f"  {note}" for note in data["notes"])
    return "\n".join(lines) + "\n"


def _quarantine_text(result: QuarantineResult) -> str:
    if result.moved_to is None:
        return f"no checkpoint in {result.state_dir}: nothing to quarantine\n"
    why = f" ({result.problem})" if result.problem else ""
    return (
        f"moved the checkpoint{why}\n  to {result.moved_to}\n"
        "corepin starts from an empty state; import again with `corepin migrate "
        "--from-kubelet FILE` if this node still has kubelet-pinned containers\n"
    )
