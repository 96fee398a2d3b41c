"""What the generators (scripts/gen_*.py) share: writing their text where the command line says.

They import it as a sibling module: `python scripts/gen_man.py` puts scripts/ on sys.path.
"""

from __future__ import annotations

import sys
from pathlib import Path


def write_output(text: str, default: str) -> int:
    """`text` to the file named by the first argument (`default` without one, creating its
    folder), or to standard output for `-`; the exit status."""
    out = sys.argv[1] if len(sys.argv) > 1 else default
    if out == "-":
        sys.stdout.write(text)
        return 0
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0
