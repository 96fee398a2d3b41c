"""What a clone holds must stand on its own: no file names design notes that are not in it."""

from __future__ import annotations

import re
import subprocess

import pytest

from support.paths import REPO

#: names of notes kept outside the repository; a clone cannot follow a reference to them
#: (spelt in lower case here and upper-cased, so that this file does not cite them either)
NOTES = tuple(name.upper() for name in ("contracts", "architecture", "kubelet_static"))
OUTSIDE_NOTES = re.compile(r"\b(?:" + "|".join(NOTES) + r")(?:\.md)?\b")


def tracked_files() -> list[str]:
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout")
    done = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    )
    return [name for name in done.stdout.decode().split("\0") if name]


def test_no_tracked_file_names_the_design_notes() -> None:
    files = tracked_files()
    assert "README.md" in files
    cited = []
    for name in files:
        path = REPO / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_NOTES.search(line):
                cited.append(f"{name}:{number}: {line.strip()}")
    assert not cited, "files that cite notes outside the repository:\n" + "\n".join(cited)


@pytest.mark.parametrize(
    ("line", "cites"),
    [
        (f"see {NOTES[0]}.md section 7", True),
        (f"#: the flags ({NOTES[0]} 7.8)", True),
        (f"as {NOTES[2]}.md says", True),
        (f"docs/{NOTES[1]}.md", True),
        ("import-linter contracts in pyproject.toml", False),
        ("docs/architecture.md", False),
        (f"{NOTES[2]}_POLICY = 1", False),
    ],
)
def test_the_pattern_finds_citations_and_not_ordinary_words(line: str, cites: bool) -> None:
    assert bool(OUTSIDE_NOTES.search(line)) is cites
