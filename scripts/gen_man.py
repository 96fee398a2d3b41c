"""Write corepin's man page (corepin(1), roff) from its own argparse parser.

Every subcommand with its usage, description and options comes from `corepin --help` and
`corepin COMMAND --help` (the parser that builds them), so the page cannot drift from the
command. Usage: python scripts/gen_man.py [OUT] (default: build/man/man1/corepin.1; `-` for
standard output). `make man` runs it.
"""

from __future__ import annotations

import argparse
import time

from _output import write_output

from corepin import __version__
from corepin.cli.main import COMMANDS, build_parser

ENVIRONMENT = (
    ("COREPIN_STATE_DIR", "state directory of host mode (default /var/lib/corepin)"),
    ("COREPIN_CGROUPS", "auto, on or off: cpuset cgroups for runs and for the shield"),
    ("COREPIN_CGROUP_ROOT", "where the cgroup hierarchies are mounted (default /sys/fs/cgroup)"),
    ("COREPIN_POLICY", "allocation policy of exclusive runs (default topology-aware)"),
    ("COREPIN_LOCK_TIMEOUT", "seconds to wait for the state lock (default 10)"),
    ("COREPIN_LOG", "info or debug: corepin's notes on standard error"),
)
#: (what it shows, the command): the EXAMPLES section. The first ones run anywhere (a machine
#: of the catalogue; tests/integration/test_cli_help.py runs them); the rest act on this host.
EXAMPLES = (
    ("Show this machine's sockets, NUMA nodes, caches and cores:", "corepin topology"),
    (
        "The same for a named synthetic machine (`corepin topology --machine list` names them):",
        "corepin topology --machine epyc-4l3",
    ),
    (
        "Which 8 CPUs the topology-aware policy would give, and why (nothing is changed):",
        "corepin allocate --machine intel-2s-ht --count 8 -o yaml",
    ),
    (
        "Four CPUs near a GPU of a synthetic GPU server:",
        "corepin allocate --machine gpu-server --count 4 --near nvidia2",
    ),
    (
        "Write a churn trace for a hybrid machine, then compare the policies on it:",
        "corepin simulate --generate --machine alderlake --events 500 --out trace.json\n"
        "corepin simulate --machine alderlake --trace trace.json",
    ),
    (
        "Run a command on 4 CPUs of its own, its memory on their NUMA node:",
        "corepin run --exclusive 4 -- ./server",
    ),
    ("Who holds which CPUs, as JSON:", "corepin report -o json"),
    (
        "Free allocations whose processes are gone, every 10 seconds:",
        "corepin reconcile --interval 10",
    ),
    (
        "A checkpoint that cannot be read (corrupt): move it aside and start empty:",
        "corepin migrate --quarantine",
    ),
)
#: how many EXAMPLES run on any machine (no state, no cgroups: `--machine`)
PORTABLE_EXAMPLES = 5
EXIT_STATUS = (
    ("0", "success (corepin run: CMD's own exit status)"),
    ("1", "internal error: a bug, please report it"),
    ("2", "bad input or usage"),
    ("3", "the request cannot be satisfied (no free CPUs, a CPU held by another run)"),
    ("4", "the environment is not usable (permissions, cgroups, sysfs, API unreachable)"),
)


def roff(text: str) -> str:
    """`text` safe in roff: backslashes and hyphens escaped, no line starting with . or '."""
    out = text.replace("\\", "\\e").replace("-", "\\-")
    lines = []
    for line in out.splitlines():
        if line.startswith((".", "'")):
            line = "\\&" + line
        lines.append(line)
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar or (
                    "{" + ",".join(action.choices) + "}" if action.choices else action.dest.upper()
                )
                if isinstance(metavar, tuple):
                    metavar = " ".join(metavar)
                names += f" {metavar}"
        else:
            names = action.metavar if isinstance(action.metavar, str) else action.dest
        out.append(".TP")
        out.append(f"\\fB{roff(names)}\\fR")
        out.append(roff((action.help or "").replace("%(default)s", str(action.default))))
    return out


def page() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    date = time.strftime("%Y-%m-%d", time.gmtime())
    lines = [
        f'.TH COREPIN 1 "{date}" "corepin {__version__}" "User Commands"',
        ".ad l",  # ragged right: option lists hold long unbreakable words
        ".SH NAME",
        "corepin \\- topology\\-aware CPU and NUMA resource manager",
        ".SH SYNOPSIS",
        "\\fBcorepin\\fR [\\fB\\-v\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
        roff(parser.description or ""),
        ".SH COMMANDS",
    ]
    for name in COMMANDS:
        cmd = sub.choices[name]
        lines.append(f".SS {roff('corepin ' + name)}")
        usage = cmd.format_usage().strip()
        usage = usage[len("usage: ") :] if usage.startswith("usage: ") else usage
        lines += [".PP", f"\\fB{roff(' '.join(usage.split()))}\\fR", ".PP"]
        lines.append(roff(cmd.description or ""))
        lines += options(cmd)
    lines.append(".SH ENVIRONMENT")
    for var, text in ENVIRONMENT:
        lines += [".TP", f"\\fB{roff(var)}\\fR", roff(text)]
    lines.append(".SH EXIT STATUS")
    for code, text in EXIT_STATUS:
        lines += [".TP", code, roff(text)]
    lines.append(".SH EXAMPLES")
    for text, command in EXAMPLES:
        lines += [".PP", roff(text), ".PP", ".nf", ".RS 4", roff(command), ".RE", ".fi"]
    lines += [
        ".SH FILES",
        ".TP",
        "\\fI/var/lib/corepin/state.json\\fR, \\fIstate.lock\\fR",
        "the checkpoint and its lock (host mode)",
        ".SH SEE ALSO",
        "\\fBnumactl\\fR(8), \\fBtaskset\\fR(1), \\fBcset\\fR(1), \\fBtuna\\fR(8), "
        "\\fBsystemd.exec\\fR(5)",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    return write_output(page(), "build/man/man1/corepin.1")


if __name__ == "__main__":
    raise SystemExit(main())
