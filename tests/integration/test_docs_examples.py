"""Every fenced example in README.md and docs/*.md runs on a fresh clone.

The convention (docs/README.md says it for writers):

- ```` ```console ````: lines starting with `$ ` are commands (a line ending in `\\` goes on to
  the next), the lines below a command are its output, stdout and stderr together. Each command
  runs in its own `bash`; it must exit 0, or N when the command line ends with `# exit N`. The
  output shown must be the output, line for line: a line `...` stands for any number of lines,
  `...` inside a line for any text on that line.
- ```` ```sh ````: a script, run by `bash -e`; it must exit 0.
- ```` ```python ````: run by the checkout's Python; it must exit 0.
- ```` ```yaml ````, ```` ```json ````, ```` ```toml ````: data; it must parse.
- ```` ```text ````: usage synopses, pictures, anything that is not an example; not run.
- `<!-- not-run: REASON -->` right above a block: it is not run (it needs a real cluster or
  hardware); `test_the_blocks_not_run_are_few_and_say_why` lists them all.
- `<!-- setup -->` right above a block: it runs before each later block of the same page (to
  make a file the later examples read, such as a machine's JSON).

Each block runs in a scratch directory of its own, with the checkout's `.venv/bin` first on
PATH and a scratch `COREPIN_STATE_DIR`; after it, that state must hold no allocation and no
reservation (an example cleans up after itself), and anything left is released.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from corepin.agent.cluster.controller.metrics import ControllerMetrics
from corepin.agent.cluster.metrics import PlacementMetrics
from corepin.agent.node.metrics import NriMetrics
from corepin.api.webhook.metrics import WebhookMetrics
from support.paths import REPO

VENV_BIN = REPO / ".venv" / "bin"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = {"console", "sh", "python"}
DATA = {"yaml", "json", "toml"}
NOT_RUN_AT_MOST = 12
TIMEOUT_S = 120
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>[^`]*)$")
COMMENT = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # the reason, when marked not-run
    setup: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of a page, with the markers right above each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        markers = _markers_above(lines, i)
        not_run = next(
            (m[len("not-run:") :].strip() for m in markers if m.startswith("not-run:")), None
        )
        lang = opening["info"].strip().split(" ")[0] if opening["info"].strip() else ""
        found.append(Block(page, i + 1, lang, "\n".join(body) + "\n", not_run, "setup" in markers))
        i = j + 1
    return found


def _markers_above(lines: list[str], fence_index: int) -> list[str]:
    markers: list[str] = []
    k = fence_index - 1
    while k >= 0 and (lines[k].strip() == "" or COMMENT.match(lines[k])):
        comment = COMMENT.match(lines[k])
        if comment is not None:
            markers.append(comment["body"])
        k -= 1
    return markers


ALL_BLOCKS = [block for page in PAGES for block in blocks_of(page)]
RUNNABLE = [b for b in ALL_BLOCKS if b.lang in RUN and b.not_run is None and not b.setup]


@cache
def machine_catalogue_ready() -> bool:
    """Whether `corepin topology --machine list` works in this checkout."""
    done = subprocess.run(
        [str(VENV_BIN / "corepin"), "topology", "--machine", "list"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return done.returncode == 0


# ---------------------------------------------------------------------- running


def _env(scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COREPIN_", "KUBECONFIG"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["COREPIN_STATE_DIR"] = str(scratch / "state")
    env["VIRTUAL_ENV"] = str(REPO / ".venv")
    env["COLUMNS"] = "200"
    return env


def _run(argv: list[str], scratch: Path, stdin: str | None = None) -> tuple[int, str]:
    done = subprocess.run(
        argv,
        cwd=scratch,
        env=_env(scratch),
        input=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return done.returncode, done.stdout


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown below it) for each `$ ` command of a console block."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            if steps:
                steps[-1][1].append(lines[i])
            elif lines[i].strip():
                raise AssertionError(f"output before the first `$ ` command: {lines[i]!r}")
            i += 1
            continue
        command = [lines[i][2:]]
        while command[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            command.append(lines[i])
        steps.append(("\n".join(command), []))
        i += 1
    return steps


def expected_exit(command: str) -> int:
    said = re.search(r"#\s*exit (\d+)\s*$", command)
    return int(said.group(1)) if said else 0


def output_pattern(shown: list[str]) -> re.Pattern[str]:
    """The output a console block shows, as a pattern over the real output."""
    while shown and not shown[-1].strip():
        shown = shown[:-1]
    parts: list[str] = []
    for line in shown:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            cells = [re.escape(cell) for cell in line.rstrip().split("...")]
            parts.append("[^\\n]*".join(cells) + r"[ \t]*\n")
    return re.compile("".join(parts))


def output_matches(shown: list[str], actual: str) -> bool:
    if not any(line.strip() for line in shown):
        return True
    normal = "\n".join(line.rstrip() for line in actual.splitlines()) + "\n"
    return output_pattern(shown).fullmatch(normal) is not None


def run_block(block: Block, scratch: Path) -> None:
    """Run one block in `scratch`; an AssertionError says what differed."""
    if block.lang == "sh":
        code, out = _run(["bash", "-e", "-c", block.text], scratch)
        assert code == 0, f"exit {code}; output:\n{out}"
    elif block.lang == "python":
        code, out = _run([str(VENV_BIN / "python"), "-"], scratch, stdin=block.text)
        assert code == 0, f"exit {code}; output:\n{out}"
    elif block.lang == "console":
        for command, shown in console_steps(block.text):
            code, out = _run(["bash", "-c", command], scratch)
            want = expected_exit(command)
            assert code == want, f"`{command}`: exit {code}, not {want}; output:\n{out}"
            assert output_matches(shown, out), (
                f"`{command}` printed:\n{out}\nthe page shows:\n" + "\n".join(shown)
            )
    else:
        raise AssertionError(f"{block.lang} blocks are not run")


def _state_left(scratch: Path) -> list[str]:
    """What an example left held in its state directory (and release it)."""
    if not (scratch / "state" / "state.json").exists():
        return []
    code, out = _run([str(VENV_BIN / "corepin"), "report", "-o", "json"], scratch)
    assert code == 0, out
    report = json.loads(out)
    left = [f"allocation {a['id']}" for a in report.get("allocations", [])]
    left += [f"reservation {r['name']}" for r in report.get("reservations") or []]
    for allocation in report.get("allocations", []):
        _run([str(VENV_BIN / "corepin"), "release", allocation["id"], "--kill"], scratch)
    for reservation in report.get("reservations") or []:
        _run([str(VENV_BIN / "corepin"), "reserve", "--delete", reservation["name"]], scratch)
    return left


# ---------------------------------------------------------------------- tests


def test_every_page_has_examples_and_every_fence_says_its_kind() -> None:
    assert len(PAGES) >= 8, PAGES
    unnamed = [b.where for b in ALL_BLOCKS if not b.lang]
    assert not unnamed, f"fences without a kind (use text for what is not an example): {unnamed}"
    unknown = [b.where for b in ALL_BLOCKS if b.lang not in RUN | DATA | {"text"}]
    assert not unknown, f"fences of a kind this test does not know: {unknown}"
    assert len(RUNNABLE) >= 15, len(RUNNABLE)


def test_no_example_needs_the_shared_fixtures() -> None:
    beside = [b.where for b in ALL_BLOCKS if "../shared" in b.text]
    assert not beside, f"examples that need ../shared (not in a clone): {beside}"


def test_the_blocks_not_run_are_few_and_say_why() -> None:
    skipped = [b for b in ALL_BLOCKS if b.not_run is not None]
    for block in skipped:
        print(f"not run: {block.where} ({block.lang}): {block.not_run}")
    assert all(len(b.not_run or "") >= 10 for b in skipped), "a not-run block without a reason"
    assert all(b.lang in RUN for b in skipped), "only runnable kinds are marked not-run"
    assert 0 < len(skipped) <= NOT_RUN_AT_MOST, len(skipped)


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang in DATA], ids=lambda b: b.where)
def test_data_block_parses(block: Block) -> None:
    if block.lang == "yaml":
        assert list(yaml.safe_load_all(block.text))
    elif block.lang == "json":
        json.loads(block.text)
    else:
        tomllib.loads(block.text)


@pytest.mark.realhost
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_example_runs(block: Block, tmp_path: Path) -> None:
    if not (VENV_BIN / "corepin").exists():
        pytest.skip(f"{VENV_BIN / 'corepin'} is missing: run make dev")
    if "--machine" in block.text and not machine_catalogue_ready():
        pytest.skip("needs --machine")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    setups = [b for b in ALL_BLOCKS if b.page == block.page and b.setup and b.line < block.line]
    try:
        for setup in setups:
            run_block(setup, scratch)
        run_block(block, scratch)
    finally:
        left = _state_left(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    assert not left, f"{block.where} left {left} held"


# ---------------------------------------------------------------------- the harness itself


def test_console_output_matching_is_line_for_line_with_ellipses() -> None:
    assert output_matches(["a", "...", "z"], "a\nb\nc\nz\n")
    assert output_matches(["a  b...", "z"], "a  bcd\nz\n")
    assert not output_matches(["a", "z"], "a\nb\nz\n")
    assert not output_matches(["a"], "b\n")
    assert not output_matches(["a"], "a\nb\n")
    assert output_matches([], "anything\n")


def test_console_steps_join_continued_lines_and_keep_their_output() -> None:
    text = "$ echo a \\\n  b   # exit 0\na b\n$ false  # exit 1\n"
    assert console_steps(text) == [("echo a \\\n  b   # exit 0", ["a b"]), ("false  # exit 1", [])]
    assert expected_exit("false  # exit 1") == 1
    assert expected_exit("echo '#' x") == 0


def test_markers_above_a_fence_are_read(tmp_path: Path) -> None:
    page = REPO / "docs" / "__probe__.md"
    text = (
        "x\n\n<!-- not-run: needs a real GPU here -->\n```sh\ntrue\n```\n"
        "<!-- setup -->\n```sh\n:\n```\n"
    )
    blocks = _blocks_of_text(text, page, tmp_path)
    assert [(b.not_run, b.setup) for b in blocks] == [
        ("needs a real GPU here", False),
        (None, True),
    ]


def _blocks_of_text(text: str, page: Path, scratch: Path) -> list[Block]:
    probe = scratch / page.name
    probe.write_text(text, encoding="utf-8")
    return [Block(page, b.line, b.lang, b.text, b.not_run, b.setup) for b in blocks_of(probe)]


# ---------------------------------------------------------------------- links and metrics

LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def anchors_of(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            found.add(slug)
    return found


def test_every_link_between_the_pages_leads_somewhere() -> None:
    broken = []
    for page in PAGES:
        for link in LINK.finditer(page.read_text(encoding="utf-8")):
            target = link["target"]
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            goal = (page.parent / path).resolve() if path else page
            if not goal.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and goal.suffix == ".md" and anchor not in anchors_of(goal):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


#: read from resctrl at each scrape, registered only where resctrl is mounted
RESCTRL_METRICS = {
    "corepin_resctrl_llc_occupancy_bytes",
    "corepin_resctrl_memory_bandwidth_bytes_total",
}


def exported_metrics() -> set[str]:
    """Every metric family the long-running commands export."""
    exported = set(RESCTRL_METRICS)
    for metrics in (NriMetrics, PlacementMetrics, ControllerMetrics, WebhookMetrics):
        registry = CollectorRegistry()  # one each: the agent's and the scheduler's names overlap
        metrics(registry)
        text = generate_latest(registry).decode()
        names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
        exported.update(n for n in names if not n.endswith("_created"))
    return exported


def test_every_exported_metric_is_on_the_metrics_page() -> None:
    page = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(corepin_\w+)` \| (\w+) \|", page, re.M))
    exported = exported_metrics()
    assert len(exported) >= 40, exported
    assert sorted(exported - set(rows)) == [], "metrics the page does not describe"
    assert sorted(set(rows) - exported) == [], "metrics the page describes that nobody exports"
    for name, kind in rows.items():
        if name.endswith("_total"):
            assert kind == "counter", name
