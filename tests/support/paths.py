"""Where the tests find things: the checkout's own directories and the shared fixtures beside it.

The checkout is the directory above `tests/`; the shared fixtures (sysfs trees of real machines,
the peer projects' published vectors and golden files) lie beside the checkout, in
`../shared/fixtures`, and tests that read them skip when they are absent.
"""

from __future__ import annotations

from pathlib import Path

#: The checkout: the directory holding pyproject.toml, src/, tests/ and deploy/.
REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
TESTS = REPO / "tests"
#: Files the tests read as they are (checkpoint files of older formats and such).
DATA = TESTS / "data"
DEPLOY = REPO / "deploy"
#: What the checkouts of this machine share, beside them; its fixtures are `sysfs/<machine>`
#: (sysfs trees of real machines) and `peer/<project>` (published vectors and golden files).
SHARED = REPO.parent / "shared"
SHARED_FIXTURES = SHARED / "fixtures"
SYSFS_FIXTURES = SHARED_FIXTURES / "sysfs"
PEER_FIXTURES = SHARED_FIXTURES / "peer"
