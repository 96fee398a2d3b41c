"""`corepin topology`: the table, tree, json, yaml and svg forms, on in-code topologies, on the
real-machine sysfs fixtures and on this host; plus the SVG layout's geometry."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from corepin import CPUSet, Topology
from corepin.cli.main import main
from corepin.cli.render import svg as svg_module
from corepin.cli.render.boxes import OWNER_COLOURS, PALETTE
from corepin.cli.render.svg import render_svg
from corepin.cli.render.table import render_table
from corepin.cli.render.tree import render_tree
from corepin.topology.model import CPUInfo, NUMANode
from support.budget import examples
from support.paths import REPO, SYSFS_FIXTURES

FIXTURES = SYSFS_FIXTURES
SVG_NS = "{http://www.w3.org/2000/svg}"


def machine(
    sockets: int = 1,
    numa: int = 1,
    l3: int = 1,
    cores: int = 2,
    threads: int = 2,
    *,
    offline: Iterable[int] = (),
    isolated: Iterable[int] = (),
    core_types: dict[int, str] | None = None,
    memory_only_nodes: int = 0,
    name: str = "",
) -> Topology:
    """Linux x86 numbering: first threads of all cores, then the second threads, ..."""
    off, iso = set(offline), set(isolated)
    total = sockets * numa * l3 * cores
    rows = []
    node_cpus: dict[int, set[int]] = {}
    for c in range(total):
        node = c // (l3 * cores)
        cpus = [c + t * total for t in range(threads)]
        node_cpus.setdefault(node, set()).update(cpus)
        for cpu in cpus:
            if cpu in off:
                rows.append(CPUInfo.offline(cpu))
                continue
            rows.append(
                CPUInfo(
                    cpu,
                    socket=c // (numa * l3 * cores),
                    die=0,
                    numa=node,
                    l3=(c // cores) * cores,
                    l2=c,
                    core=min(x for x in cpus if x not in off),
                    isolated=cpu in iso,
                    core_type=(core_types or {}).get(c),
                )
            )
    nodes = [NUMANode(n, CPUSet(cs)) for n, cs in node_cpus.items()]
    first_free = len(nodes)
    nodes += [
        NUMANode(first_free + i, CPUSet(), memory_kb=8 * 1024 * 1024)
        for i in range(memory_only_nodes)
    ]
    return Topology(rows, nodes, name=name)


def table_rows(text: str) -> list[list[str]]:
    """The core rows of a table: the lines after the header that start with a socket id."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SOCKET"))
    return [line.split() for line in lines[start + 1 :] if re.match(r"[\d-]+\s", line)]


def parse_svg(text: str) -> ET.Element:
    return ET.fromstring(text.encode("utf-8"))


def pu_rects(root: ET.Element) -> dict[int, ET.Element]:
    """CPU id -> the <rect> of its box (every CPU box is a <g> titled 'CPU n...')."""
    out: dict[int, ET.Element] = {}
    for group in root.iter(f"{SVG_NS}g"):
        title = group.find(f"{SVG_NS}title")
        rect = group.find(f"{SVG_NS}rect")
        if title is None or rect is None or title.text is None:
            continue
        m = re.match(r"CPU (\d+)\b", title.text)
        if m:
            cpu = int(m.group(1))
            assert cpu not in out, f"CPU {cpu} is drawn twice"
            out[cpu] = rect
    return out


# --------------------------------------------------------------------------- table


def test_table_has_one_row_per_physical_core_with_its_threads() -> None:
    text = render_table(machine(sockets=2, cores=4, threads=2))
    lines = text.splitlines()
    assert lines[0] == (
        "2 sockets, 2 NUMA nodes, 2 L3 caches, 8 cores, 16 CPUs, 2 threads per core"
    )
    header = next(line for line in lines if line.startswith("SOCKET"))
    assert header.split() == ["SOCKET", "NUMA", "L3", "CORE", "CPUS", "FLAGS"]
    rows = table_rows(text)
    assert len(rows) == 8
    assert rows[0] == ["0", "0", "0", "0", "0,8"]
    assert rows[-1] == ["1", "1", "4", "7", "7,15"]


def test_table_groups_sockets_with_a_blank_line_between_them() -> None:
    lines = render_table(machine(sockets=2, cores=2)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SOCKET"))
    body = lines[start + 1 : start + 1 + 5]
    assert [line.split()[0] if line else "" for line in body] == ["0", "0", "", "1", "1"]


def test_table_marks_isolated_and_offline_cpus_and_lists_memory_only_nodes() -> None:
    topo = machine(cores=4, offline=[7], isolated=[1, 5], memory_only_nodes=1)
    text = render_table(topo)
    rows = {row[3]: row for row in table_rows(text)}
    assert rows["1"][-1] == "isolated"  # both threads of core 1 are isolated
    assert rows["3"][3:] == ["3", "3"]  # core 3 lost its sibling 7 (offline, no topology)
    assert "offline CPUs (topology unknown while offline): 7" in text
    assert "isolated CPUs (isolcpus): 1,5" in text
    assert "NUMA node 1: memory only, no CPUs, 8.0 GiB" in text


def test_table_shows_partly_isolated_cores_by_cpu() -> None:
    text = render_table(machine(cores=2, isolated=[2]))
    assert "isolated:2" in text


def test_table_has_a_type_column_on_hybrid_machines() -> None:
    topo = machine(
        cores=4,
        threads=1,
        core_types={0: "performance", 1: "performance", 2: "efficiency", 3: "efficiency"},
    )
    text = render_table(topo)
    header = next(line for line in text.splitlines() if line.startswith("SOCKET")).split()
    assert "TYPE" in header
    types = [row[header.index("TYPE")] for row in table_rows(text)]
    assert types == ["P-core", "P-core", "E-core", "E-core"]


def test_table_prints_numa_distances_when_the_machine_has_several_nodes() -> None:
    rows = [CPUInfo(0, socket=0, numa=0, core=0), CPUInfo(1, socket=1, numa=1, core=1)]
    nodes = [NUMANode(0, CPUSet.of(0), {0: 10, 1: 21}), NUMANode(1, CPUSet.of(1), {0: 21, 1: 10})]
    text = render_table(Topology(rows, nodes))
    assert re.search(r"^node 0\s+10\s+21$", text, re.M)
    assert re.search(r"^node 1\s+21\s+10$", text, re.M)


# --------------------------------------------------------------------------- tree


def test_tree_nests_socket_numa_l3_and_core_by_indentation() -> None:
    text = render_tree(machine(sockets=2, numa=1, l3=2, cores=2, threads=2))
    lines = text.splitlines()
    assert lines[1] == "machine: CPUs 0-15 (16)"
    assert "  socket 0: CPUs 0-3,8-11 (8)" in lines
    assert "    NUMA node 0: CPUs 0-3,8-11 (8)" in lines
    assert "      L3 0: CPUs 0-1,8-9 (4)" in lines
    assert "        core 0: threads 0,8" in lines
    assert not any("die" in line for line in lines)  # one die per socket says nothing


def test_tree_marks_isolated_cores_and_lists_offline_and_memory_only() -> None:
    text = render_tree(machine(cores=2, isolated=[1, 3], offline=[2], memory_only_nodes=1))
    assert "core 1: threads 1,3  [isolated]" in text
    assert "NUMA node 1: memory only" in text
    assert "offline: CPUs 2" in text


# --------------------------------------------------------------------------- svg


def test_svg_is_well_formed_and_draws_every_present_cpu_once() -> None:
    topo = machine(sockets=2, numa=2, l3=2, cores=3, threads=2)
    root = parse_svg(render_svg(topo))
    assert root.tag == f"{SVG_NS}svg"
    assert set(pu_rects(root)) == set(topo.present_cpus)
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    for label in ("Socket 0", "Socket 1", "NUMA node 3", "L3 #0", "Core 0"):
        assert label in texts


def test_svg_hatches_offline_cpus_and_marks_isolated_ones() -> None:
    topo = machine(cores=4, offline=[6, 7], isolated=[1])
    svg = render_svg(topo)
    rects = pu_rects(parse_svg(svg))
    assert set(rects) == set(range(8))
    assert rects[6].get("fill") == "url(#hatch)" and rects[7].get("fill") == "url(#hatch)"
    assert rects[1].get("stroke-dasharray") and rects[1].get("fill") != "#ffffff"
    assert rects[0].get("fill") == "#ffffff" and not rects[0].get("stroke-dasharray")
    assert '<pattern id="hatch"' in svg
    assert "Offline CPUs" in svg
    assert "offline CPU 6-7" in svg and "isolated CPU 1" in svg  # legend


def test_svg_colours_hybrid_core_types_differently_and_says_which_is_which() -> None:
    topo = machine(
        cores=4,
        threads=1,
        core_types={0: "performance", 1: "performance", 2: "efficiency", 3: "efficiency"},
    )
    root = parse_svg(render_svg(topo))
    fills: dict[str, str | None] = {}
    for group in root.iter(f"{SVG_NS}g"):
        title = group.find(f"{SVG_NS}title")
        rect = group.find(f"{SVG_NS}rect")
        if title is not None and rect is not None and title.text:
            m = re.match(r"([PE])-core", title.text)
            if m:
                fills[m.group(1)] = rect.get("fill")
    assert set(fills) == {"P", "E"} and fills["P"] != fills["E"]
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    assert "P-core" in texts and "E-core" in texts


def test_svg_shows_memory_only_numa_nodes() -> None:
    svg = render_svg(machine(cores=2, memory_only_nodes=2))
    assert svg.count("memory only") == 2
    assert "NUMA node 2" in svg and "8 GiB" in svg


def test_svg_colours_cpus_by_owner_with_fixed_colours_for_pools_and_a_legend() -> None:
    topo = machine(cores=4, threads=2)
    owners = {
        0: "web",
        4: "web",
        1: "db<&>",
        2: "shared",
        6: "shared",
        3: "reserved",
        5: "free",
        7: "free",
    }
    svg = render_svg(topo, owners=owners, title="corepin report")
    root = parse_svg(svg)  # owner names are escaped
    rects = pu_rects(root)
    assert rects[2].get("fill") == OWNER_COLOURS["shared"] == rects[6].get("fill")
    assert rects[3].get("fill") == OWNER_COLOURS["reserved"]
    assert rects[5].get("fill") == OWNER_COLOURS["free"]
    assert {rects[0].get("fill"), rects[1].get("fill")} == set(PALETTE[:2])
    assert rects[0].get("fill") == rects[4].get("fill")
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    assert "web: CPUs 0,4" in texts and "db<&>: CPUs 1" in texts
    assert "shared: CPUs 2,6" in texts and "free: CPUs 5,7" in texts
    assert "corepin report" in texts


def test_svg_without_legend_has_no_legend_entries() -> None:
    topo = machine()
    assert "physical core" in render_svg(topo)
    assert "physical core" not in render_svg(topo, legend=False)


def test_svg_is_deterministic() -> None:
    topo = machine(sockets=2, numa=2, cores=5, isolated=[3], offline=[9])
    assert render_svg(topo) == render_svg(topo)


def _size(svg: str) -> tuple[float, float]:
    root = parse_svg(svg)
    return float(root.get("width", "0")), float(root.get("height", "0"))


@pytest.mark.parametrize(
    ("shape", "max_width"),
    [
        ((1, 1, 1, 1, 2), 600),
        ((1, 1, 1, 2, 1), 600),
        ((2, 2, 4, 16, 2), 2400),
        ((2, 4, 2, 16, 4), 2400),
    ],
    ids=[
        "two CPUs in one core give a small picture",
        "two single-thread cores give a small picture",
        "512 CPUs wrap into rows that stay within a screen-like width",
        "1024 CPUs with SMT4 still wrap into a bounded width",
    ],
)
def test_svg_layout_scales_from_two_cpus_to_a_thousand(
    shape: tuple[int, int, int, int, int], max_width: float
) -> None:
    topo = machine(*shape)
    svg = render_svg(topo)
    width, height = _size(svg)
    assert width <= max_width
    assert height <= 4 * width  # wrapped, not one endless strip
    assert len(pu_rects(parse_svg(svg))) == len(topo.present_cpus)


def _check_geometry(box: svg_module._Box) -> None:
    """Children lie inside their parent below its label, and siblings never overlap."""
    placed = []
    for child, (dx, dy) in zip(box.children, box.offsets, strict=True):
        assert dx >= 0 and dy >= 0
        assert dx + child.w <= box.w + 1e-6, (box.label, child.label)
        assert dy + child.h <= box.h + 1e-6, (box.label, child.label)
        placed.append((dx, dy, dx + child.w, dy + child.h, child.label))
        _check_geometry(child)
    for i, a in enumerate(placed):
        for b in placed[i + 1 :]:
            overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
            assert not overlap, (box.label, a[4], b[4])


@settings(max_examples=examples(40))
@given(
    shape=st.tuples(
        st.integers(1, 3),
        st.integers(1, 3),
        st.integers(1, 3),
        st.integers(1, 9),
        st.integers(1, 4),
    ),
    data=st.data(),
)
def test_svg_boxes_nest_without_overlapping_for_any_machine_shape(
    shape: tuple[int, int, int, int, int], data: st.DataObject
) -> None:
    total = shape[0] * shape[1] * shape[2] * shape[3] * shape[4]
    # keep CPU 0 online so the machine is never empty; drop any others
    offline = data.draw(st.sets(st.integers(1, total - 1), max_size=3)) if total > 1 else set()
    isolated = data.draw(st.sets(st.integers(0, total - 1), max_size=3))
    memory_only = data.draw(st.integers(0, 2))
    topo = machine(
        *shape, offline=offline, isolated=isolated - offline, memory_only_nodes=memory_only
    )
    box = svg_module._layout(topo, None)
    _check_geometry(box)
    assert set(pu_rects(parse_svg(render_svg(topo)))) == set(topo.present_cpus)


# --------------------------------------------------------------------------- the command


def _write_topology(tmp_path: Path, topo: Topology) -> str:
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(topo.to_json()), encoding="utf-8")
    return str(path)


def test_json_output_round_trips_through_topology_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = machine(sockets=2, cores=3, isolated=[1], offline=[11])
    assert main(["topology", "--topology", _write_topology(tmp_path, topo), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == topo.to_json()
    assert Topology.from_json(data) == topo


def test_yaml_output_holds_the_same_data_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = machine(cores=2)
    assert main(["topology", "--topology", _write_topology(tmp_path, topo), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == topo.to_json()


@pytest.mark.parametrize("fmt", ["table", "tree", "svg"])
def test_every_text_form_can_be_written_to_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    out = tmp_path / f"picture.{fmt}"
    topo_file = _write_topology(tmp_path, machine())
    assert main(["topology", "--topology", topo_file, "-o", fmt, "--out", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert out.read_text(encoding="utf-8").strip()


def test_default_output_is_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "--topology", _write_topology(tmp_path, machine())]) == 0
    assert "SOCKET" in capsys.readouterr().out


def test_a_missing_topology_file_is_bad_input_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nope.json")
    assert main(["topology", "--topology", missing]) == 2
    err = capsys.readouterr().err
    assert "nope.json" in err and "Traceback" not in err


def test_a_topology_file_that_is_not_json_is_bad_input_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    assert main(["topology", "--topology", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_an_unknown_output_format_is_a_usage_error_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["topology", "-o", "png"])
    assert info.value.code == 2
    assert "png" in capsys.readouterr().err


def test_an_unwritable_out_file_is_bad_input_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo_file = _write_topology(tmp_path, machine())
    out = tmp_path / "no-such-dir" / "x.svg"
    assert main(["topology", "--topology", topo_file, "-o", "svg", "--out", str(out)]) == 2
    assert "x.svg" in capsys.readouterr().err


def test_a_sysfs_root_without_cpus_is_an_environment_problem_exit_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topology", "--sysfs-root", str(tmp_path)]) == 4
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "Traceback" not in err


def test_topology_and_sysfs_root_cannot_be_given_together(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["topology", "--topology", "a.json", "--sysfs-root", "/"])
    assert info.value.code == 2


# --------------------------------------------------------------------------- real machines

MACHINES = sorted(p.name for p in FIXTURES.iterdir()) if FIXTURES.is_dir() else []


def _expected_cores(name: str) -> set[CPUSet] | None:
    data = json.loads((FIXTURES / name / "expected.json").read_text(encoding="utf-8"))
    cpus = data.get("cpus")
    if not isinstance(cpus, dict):
        return None
    return {CPUSet.parse(row["thread_siblings"]) for row in cpus.values()}


@pytest.mark.skipif(not MACHINES, reason="../shared/fixtures/sysfs is not available")
@pytest.mark.parametrize("name", MACHINES)
def test_every_fixture_machine_renders_in_every_form(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(FIXTURES / name)
    assert main(["topology", "--sysfs-root", root, "-o", "json"]) == 0
    topo = Topology.from_json(json.loads(capsys.readouterr().out))

    assert main(["topology", "--sysfs-root", root]) == 0
    table = capsys.readouterr().out
    core_rows = table_rows(table)
    assert len(core_rows) == len(topo.core_ids())
    expected = _expected_cores(name)
    if expected is not None:  # hwloc's physical cores, one table row each
        assert len(core_rows) == len(expected)

    assert main(["topology", "--sysfs-root", root, "-o", "tree"]) == 0
    tree = capsys.readouterr().out
    assert sum(1 for line in tree.splitlines() if line.lstrip().startswith("core ")) == len(
        topo.core_ids()
    )

    assert main(["topology", "--sysfs-root", root, "-o", "svg"]) == 0
    drawn = pu_rects(parse_svg(capsys.readouterr().out))
    assert set(drawn) == set(topo.present_cpus)
    for cpu in topo.offline_cpus:
        assert drawn[cpu].get("fill") == "url(#hatch)"


@pytest.mark.skipif(
    not Path("/sys/devices/system/cpu/online").exists(), reason="this host has no sysfs"
)
def test_this_host_renders_as_a_table_and_a_picture(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology"]) == 0
    assert "SOCKET" in capsys.readouterr().out
    assert main(["topology", "-o", "svg"]) == 0
    assert len(pu_rects(parse_svg(capsys.readouterr().out))) >= 1


DOCS = {
    "topology-intel-2s-ht.svg": "intel-2s-8c-ht-32cpu",
    "topology-amd-epyc-16l3.svg": "amd-2s-epyc7451-naples-16l3",
}


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_committed_pictures_match_what_the_code_draws_now(
    doc: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    committed = REPO / "docs" / doc
    fixture = FIXTURES / DOCS[doc]
    if not committed.exists() or not fixture.is_dir():
        pytest.skip("picture or fixture not available")
    out = tmp_path / doc
    assert main(["topology", "--sysfs-root", str(fixture), "-o", "svg", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
        f"docs/{doc} is stale: run `make docs` and commit it"
    )


def test_svg_owner_colours_can_be_chosen_by_the_caller() -> None:
    owners = {0: "web", 1: "shared", 2: "batch"}
    rects = pu_rects(
        parse_svg(render_svg(machine(), owners=owners, colours={"web": "#123456", "shared": "red"}))
    )
    assert rects[0].get("fill") == "#123456"
    assert rects[1].get("fill") == "red"
    assert rects[2].get("fill") == PALETTE[0]  # the palette skips owners the caller coloured
    assert rects[3].get("fill") == "#ffffff"  # no owner: free-looking white
