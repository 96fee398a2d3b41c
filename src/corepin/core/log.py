"""Log records of the lower layers without loading `logging` when nobody will read them.

`logging` (with `threading`, `traceback`, `string`, ...) costs several milliseconds to import,
and on the path of `corepin run` nothing is shown unless asked (`-v`, COREPIN_LOG). The command
line says `silence(True)` before it runs a command that shows nothing; `emit` then returns at
once. Otherwise (`-v`, a library user, the long-running agents) records go to the standard
`logging` logger named `name`, as usual.
"""

from __future__ import annotations

_silent = False


def silence(flag: bool) -> bool:
    """Drop (True) or pass on (False) every record from now on; returns the previous setting."""
    global _silent
    previous = _silent
    _silent = flag
    return previous


def emit(name: str, level: int, message: str, *args: object) -> None:
    """`logging.getLogger(name).log(level, message, *args)`, unless silenced."""
    if _silent:
        return
    import logging

    logging.getLogger(name).log(level, message, *args)


#: logging's level numbers, without importing logging
INFO, WARNING = 20, 30
