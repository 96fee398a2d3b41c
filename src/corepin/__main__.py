"""`python -m corepin`, and the `corepin` console script (`entry`)."""

from __future__ import annotations


def entry() -> int:
    """Run the command line; a Ctrl-C while corepin's modules are still loading is the same
    quiet exit 130 as one later on (CONTRACTS.md section 6)."""
    try:
        from corepin.cli.main import main
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or isinstance(
            exc.__cause__ or exc.__context__, KeyboardInterrupt
        ):
            return 130
        raise
    return main()


if __name__ == "__main__":
    raise SystemExit(entry())
