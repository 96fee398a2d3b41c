"""Boot a guest by hand, run something in it, tear it down.

    python -m tests.vm --list
    python -m tests.vm SHAPE -- CMD [ARGS...]        a command (argv, run by /bin/sh quoted)
    python -m tests.vm SHAPE --sh 'shell text'       shell text as it is
    python -m tests.vm SHAPE --shell-script FILE     a shell script from the host
    python -m tests.vm SHAPE --pytest [PYTEST ARGS]  a pytest selection of this checkout

Run from the checkout's root as root (after `make dev`). Prints the command's output and exits
with its exit code; 125 when the guest does not boot or dies (with the console's tail), 77 when
guests cannot run here (with the reason). `--keep` leaves the scratch directory (console log,
boot files) behind and prints where it is.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .guest import Guest, GuestError, skip_reason
from .shapes import SHAPES


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.vm", description=__doc__.split("\n")[0])
    parser.add_argument("shape", nargs="?", help="one of --list")
    parser.add_argument("--list", action="store_true", help="show the shapes and exit")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--sh", metavar="TEXT", help="shell text to run")
    what.add_argument("--shell-script", metavar="FILE", help="a shell script to run")
    what.add_argument("--pytest", action="store_true", help="run pytest with the rest")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.list:
        for shape in SHAPES.values():
            print(shape.describe())
        return 0
    if args.shape not in SHAPES:
        parser.error(f"choose a shape: {', '.join(SHAPES)} (got {args.shape!r})")
    reason = skip_reason()
    if reason:
        print(f"guests cannot run here: {reason}", file=sys.stderr)
        return 77
    if args.sh is not None:
        command: str | list[str] = args.sh
    elif args.shell_script is not None:
        command = Path(args.shell_script).read_text()
    elif args.pytest:
        command = ["python", "-m", "pytest", "-p", "no:cacheprovider", *rest]
    elif rest:
        command = rest
    else:
        parser.error("nothing to run: give -- CMD, --sh, --shell-script or --pytest")
    workdir = Path(tempfile.mkdtemp(prefix="corepin-vm-"))
    guest = Guest(SHAPES[args.shape], workdir)
    try:
        began = time.monotonic()
        guest.start()
        print(f"vm: {guest.shape.describe()}", file=sys.stderr)
        print(f"vm: kernel {guest.release}, booted in {guest.boot_seconds:.1f}s", file=sys.stderr)
        result = guest.run(command, timeout=args.timeout)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        print(
            f"vm: exit {result.returncode} after {result.seconds:.1f}s "
            f"({time.monotonic() - began:.1f}s with the boot)",
            file=sys.stderr,
        )
        return result.returncode
    except GuestError as exc:
        print(f"vm: {exc}", file=sys.stderr)
        return 125
    finally:
        guest.stop()
        if args.keep:
            print(f"vm: scratch files kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
