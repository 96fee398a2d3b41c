"""CPUSet: set algebra against Python's frozenset as the model, the Linux list format (parse,
canonical str, stride form), hex masks, and rejection of every malformed text."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corepin import CPUSet
from corepin.core.cpuset import MAX_CPUS
from corepin.core.errors import CPUSetParseError, InputError
from support import strategies
from support.budget import examples

PROPS = settings(max_examples=examples(120))
FUZZ = settings(max_examples=examples(200))

# Mostly small ids (where ranges and overlaps happen), sometimes anywhere below the bound.
cpu_ids = st.one_of(st.integers(0, 80), st.integers(0, MAX_CPUS - 1))
id_sets = strategies.cpu_id_sets(cpu_ids, max_size=40)
cpusets = id_sets.map(CPUSet)


def canonical_reference(ids: frozenset[int]) -> str:
    """The Linux list form computed the obvious way: maximal runs of consecutive ids."""
    parts: list[str] = []
    ordered = sorted(ids)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# --------------------------------------------------------------------------- the model


@PROPS
@given(id_sets)
def test_a_cpuset_holds_exactly_the_ids_it_was_built_from(ids: frozenset[int]) -> None:
    s = CPUSet(ids)
    assert set(s) == ids
    assert len(s) == len(ids)
    assert bool(s) == bool(ids)
    assert list(s) == sorted(ids) == s.sorted()
    assert list(reversed(s)) == sorted(ids, reverse=True)
    for cpu in list(ids)[:5]:
        assert cpu in s
    assert -1 not in s and MAX_CPUS not in s and "0" not in s
    if ids:
        assert s.first() == min(ids) and s.last() == max(ids)


@PROPS
@given(id_sets, id_sets)
def test_every_set_operation_agrees_with_frozenset(a: frozenset[int], b: frozenset[int]) -> None:
    x, y = CPUSet(a), CPUSet(b)
    assert set(x | y) == a | b == set(x.union(y))
    assert set(x & y) == a & b == set(x.intersection(y))
    assert set(x - y) == a - b == set(x.difference(y))
    assert set(x ^ y) == a ^ b == set(x.symmetric_difference(y))
    assert (x <= y) == (a <= b) and (x < y) == (a < b)
    assert (x >= y) == (a >= b) and (x > y) == (a > b)
    assert x.isdisjoint(y) == a.isdisjoint(b)
    assert x.issubset(y) == a.issubset(b) and x.issuperset(y) == a.issuperset(b)
    assert (x == y) == (a == b)


@PROPS
@given(cpusets, cpusets, cpusets)
def test_union_and_intersection_are_commutative_associative_and_distributive(
    a: CPUSet, b: CPUSet, c: CPUSet
) -> None:
    assert a | b == b | a and a & b == b & a and a ^ b == b ^ a
    assert (a | b) | c == a | (b | c) == a.union(b, c)
    assert (a & b) & c == a & (b & c) == a.intersection(b, c)
    assert a | (b & c) == (a | b) & (a | c)
    assert a & (b | c) == (a & b) | (a & c)
    assert a - (b | c) == (a - b) & (a - c) == a.difference(b, c)


@PROPS
@given(cpusets, cpusets, cpusets)
def test_de_morgan_holds_inside_a_universe(u: CPUSet, a: CPUSet, b: CPUSet) -> None:
    universe = u | a | b
    assert universe - (a | b) == (universe - a) & (universe - b)
    assert universe - (a & b) == (universe - a) | (universe - b)
    assert universe - (universe - a) == a


@PROPS
@given(cpusets, cpusets)
def test_difference_and_intersection_identities(a: CPUSet, b: CPUSet) -> None:
    empty = CPUSet()
    assert a - a == empty and a & a == a and a | a == a
    assert a | empty == a and a & empty == empty and a - empty == a
    assert (a - b) & b == empty
    assert (a - b) | (a & b) == a
    assert a ^ b == (a - b) | (b - a)
    assert a & b <= a <= a | b


@PROPS
@given(id_sets)
def test_equal_sets_hash_equal_and_cpusets_are_immutable(ids: frozenset[int]) -> None:
    s, t = CPUSet(ids), CPUSet(sorted(ids, reverse=True))
    assert s == t and hash(s) == hash(t)
    assert len({s, t}) == 1
    assert pickle.loads(pickle.dumps(s)) == s
    assert copy.copy(s) is s and copy.deepcopy(s) is s
    with pytest.raises(AttributeError):
        s._mask = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del s._mask


@PROPS
@given(id_sets, st.integers(0, 50))
def test_lowest_n_takes_the_n_smallest_ids(ids: frozenset[int], n: int) -> None:
    assert set(CPUSet(ids).lowest(n)) == set(sorted(ids)[:n])


def test_a_cpuset_is_never_equal_to_a_plain_set_or_int() -> None:
    assert CPUSet.of(1, 2) != {1, 2}
    assert CPUSet.of(0) != 1
    with pytest.raises(TypeError):
        _ = CPUSet.of(1) | {2}  # type: ignore[operator]


def test_construction_rejects_ids_outside_the_bound_and_non_ints() -> None:
    with pytest.raises(ValueError, match="8192"):
        CPUSet([MAX_CPUS])
    with pytest.raises(ValueError, match="-1"):
        CPUSet([-1])
    with pytest.raises(TypeError):
        CPUSet([True])
    with pytest.raises(TypeError):
        CPUSet(["1"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        CPUSet.from_bits(-1)
    with pytest.raises(ValueError):
        CPUSet.from_bits(1 << MAX_CPUS)
    with pytest.raises(ValueError):
        CPUSet.range(3, 2)
    assert CPUSet.range(2, 5) == CPUSet.of(2, 3, 4, 5)
    with pytest.raises(ValueError):
        CPUSet().first()
    with pytest.raises(ValueError):
        CPUSet().last()


# --------------------------------------------------------------------------- list format


@PROPS
@given(id_sets)
def test_str_is_the_canonical_linux_list_and_parses_back(ids: frozenset[int]) -> None:
    s = CPUSet(ids)
    text = str(s)
    assert text == canonical_reference(ids)
    assert CPUSet.parse(text) == s
    assert str(CPUSet.parse(text)) == text
    assert f"{s}" == text and repr(s) == f"CPUSet({text!r})"


def test_known_canonical_forms() -> None:
    assert str(CPUSet()) == ""
    assert str(CPUSet.of(0)) == "0"
    assert str(CPUSet.of(0, 1)) == "0-1"
    assert str(CPUSet.of(0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert str(CPUSet.of(MAX_CPUS - 1)) == str(MAX_CPUS - 1)
    assert CPUSet.parse("") == CPUSet() == CPUSet.parse(" \n")
    assert CPUSet.parse("0-3,8\n") == CPUSet.of(0, 1, 2, 3, 8)


@st.composite
def scrambled_lists(draw: st.DrawFn) -> tuple[frozenset[int], str]:
    """A set and a messy list text for it: pieces that overlap, repeat and come in any order."""
    ids = draw(st.frozensets(st.integers(0, 120), max_size=30))
    pieces: list[str] = []
    for cpu in sorted(ids):
        kind = draw(st.sampled_from(["single", "range", "dup"]))
        if kind == "single":
            pieces.append(str(cpu))
        elif kind == "dup":
            pieces += [str(cpu), str(cpu)]
        else:  # a range ending at cpu that stays inside the set (so it adds nothing new)
            first = cpu
            while first - 1 in ids and draw(st.booleans()):
                first -= 1
            pieces.append(f"{first}-{cpu}")
    shuffled = draw(st.permutations(pieces))
    return ids, ",".join(shuffled)


@PROPS
@given(scrambled_lists())
@example((frozenset({0, 1, 2, 3}), "3,0-2,1-3,2"))
@example((frozenset({5}), "5,5,5-5"))
def test_any_permutation_duplication_or_overlap_of_ranges_canonicalises(
    case: tuple[frozenset[int], str],
) -> None:
    ids, text = case
    parsed = CPUSet.parse(text)
    assert set(parsed) == ids
    assert str(parsed) == canonical_reference(ids)
    assert str(CPUSet.parse(str(parsed))) == str(parsed)


@PROPS
@given(
    st.integers(0, 300),
    st.integers(0, 300),
    st.integers(1, 40),
    st.integers(1, 40),
)
def test_stride_form_selects_used_ids_out_of_every_group(
    first: int, span: int, used: int, group: int
) -> None:
    if used > group:
        used, group = group, used
    last = first + span
    text = f"{first}-{last}:{used}/{group}"
    expected = {i for i in range(first, last + 1) if (i - first) % group < used}
    assert set(CPUSet.parse(text)) == expected
    assert CPUSet.parse(f"7,{text}") == CPUSet(expected | {7})


def test_stride_form_examples_from_the_kernel_documentation() -> None:
    # Documentation/admin-guide/kernel-parameters.rst: "100-2550:2/25" etc.
    assert CPUSet.parse("0-15:2/4") == CPUSet.parse("0-1,4-5,8-9,12-13")
    assert CPUSet.parse("0-9:1/3") == CPUSet.of(0, 3, 6, 9)
    assert CPUSet.parse("2-7:3/3") == CPUSet.range(2, 7)
    assert str(CPUSet.parse("0-1023:2/256")) == "0-1,256-257,512-513,768-769"


# --------------------------------------------------------------------------- hex masks


@PROPS
@given(id_sets, st.integers(0, MAX_CPUS // 32))
def test_mask_round_trip_with_kernel_word_padding(ids: frozenset[int], words: int) -> None:
    s = CPUSet(ids)
    mask = s.to_mask(words)
    parts = mask.split(",")
    assert len(parts) >= max(words, 1)
    assert all(re.fullmatch(r"[0-9a-f]{8}", p) for p in parts)
    assert int(mask.replace(",", ""), 16) == sum(1 << i for i in ids)
    assert CPUSet.from_mask(mask) == s
    assert CPUSet.from_mask(mask.upper()) == s
    assert CPUSet.from_mask("0x" + mask) == s


@PROPS
@given(id_sets)
def test_mask_with_short_top_word_as_in_proc_status_parses(ids: frozenset[int]) -> None:
    """/proc prints e.g. `f,ffffffff` for 36 CPUs: the top word may be shorter than 8 digits."""
    s = CPUSet(ids)
    words = s.to_mask().split(",")
    words[0] = words[0].lstrip("0") or "0"
    assert CPUSet.from_mask(",".join(words) + "\n") == s
    assert CPUSet.from_mask(format(s.bits, "x")) == s  # one unseparated word of any width


def test_known_masks() -> None:
    assert CPUSet.from_mask("f,ffffffff") == CPUSet.range(0, 35)
    assert CPUSet.from_mask("00000000,00000001") == CPUSet.of(0)
    assert CPUSet.from_mask("80000000,00000000") == CPUSet.of(63)
    assert CPUSet.from_mask("3") == CPUSet.of(0, 1)
    assert CPUSet.of(0, 1).to_mask() == "00000003"
    assert CPUSet().to_mask() == "00000000"
    assert CPUSet.of(32).to_mask(4) == "00000000,00000000,00000001,00000000"


@pytest.mark.parametrize(
    "text",
    ["", ",", "g", "0x", "ff,", ",ff", "1ffffffff,00000000", "f f", "-1", "ff;ff", "ff,,ff"],
    ids=lambda t: repr(t),
)
def test_malformed_masks_are_rejected_naming_the_text(text: str) -> None:
    with pytest.raises(CPUSetParseError) as info:
        CPUSet.from_mask(text)
    assert repr(text) in str(info.value)


def test_a_mask_wider_than_the_cpu_bound_is_rejected() -> None:
    with pytest.raises(CPUSetParseError):
        CPUSet.from_mask("1" + "0" * (MAX_CPUS // 4))


# --------------------------------------------------------------------------- malformed lists

MALFORMED = {
    "trailing comma": "0,",
    "leading comma": ",3",
    "lone comma": ",",
    "double comma": "0,,1",
    "range that ends before it starts": "3-0",
    "range without an end": "1-",
    "negative id": "-1",
    "double dash": "0--3",
    "range with two dashes": "0-3-5",
    "letter": "a",
    "hex-looking id": "0x3",
    "plus sign": "+1",
    "decimal point": "1.5",
    "id at the limit": str(MAX_CPUS),
    "range ending beyond the limit": f"0-{MAX_CPUS}",
    "absurdly large id": "9" * 40,
    "stride with zero used": "0-3:0/2",
    "stride with zero group": "0-3:1/0",
    "stride using more than its group": "0-7:3/2",
    "stride on a single id": "1:2/3",
    "stride without used count": "0-3:/2",
    "stride without group": "0-3:2",
    "stride without slash": "0-3:2:4",
    "arabic-indic digit": "\u0663",
    "fullwidth digit": "\uff11",
    "fullwidth digit in a range": "0-\uff13",
    "superscript two": "\u00b2",
    "space after comma": "0, 1",
    "space inside range": "0 -3",
    "space between ids": "1 2",
    "tab inside": "0-\t3",
    "newline inside": "0\n,1",
    "semicolon separator": "0;1",
}


@pytest.mark.parametrize("text", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_list_is_a_value_error_naming_the_bad_text(text: str) -> None:
    with pytest.raises(CPUSetParseError) as info:
        CPUSet.parse(text)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, InputError)
    assert err.exit_code == 2 and err.reason == "bad_cpuset"
    assert err.text == text
    assert repr(text) in str(err)


def test_parse_takes_only_strings() -> None:
    with pytest.raises(TypeError):
        CPUSet.parse(b"0-3")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CPUSet.from_mask(3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- fuzz


def _parse_or_error(text: str) -> CPUSet | None:
    try:
        return CPUSet.parse(text)
    except CPUSetParseError as exc:
        assert exc.text == text
        return None


@FUZZ
@given(st.text(max_size=30))
def test_parse_of_arbitrary_text_returns_a_cpuset_or_raises_the_parse_error(text: str) -> None:
    result = _parse_or_error(text)
    if result is not None:
        assert CPUSet.parse(str(result)) == result


@FUZZ
@given(st.text(alphabet="0123456789-,:/ \n", max_size=20))
def test_parse_of_list_like_text_matches_a_reference_parser(text: str) -> None:
    result = _parse_or_error(text)
    expected = _reference_parse(text)
    assert result == expected


def _reference_parse(text: str) -> CPUSet | None:
    """An independent, slow reading of the grammar (ASCII digits, at most 6 per number)."""
    body = text.strip()
    if body == "":
        return CPUSet()
    ids: set[int] = set()
    for item in body.split(","):
        m = re.fullmatch(r"([0-9]{1,6})(?:-([0-9]{1,6})(?::([0-9]{1,6})/([0-9]{1,6}))?)?", item)
        if m is None:
            return None
        a = int(m[1])
        b = int(m[2]) if m[2] is not None else a
        used = int(m[3]) if m[3] is not None else 1
        group = int(m[4]) if m[4] is not None else 1
        if b >= MAX_CPUS or b < a or not 1 <= used <= group:
            return None
        ids.update(i for i in range(a, b + 1) if (i - a) % group < used)
    return CPUSet(ids)


@FUZZ
@given(st.text(max_size=24))
def test_from_mask_of_arbitrary_text_returns_a_cpuset_or_raises_the_parse_error(text: str) -> None:
    try:
        result = CPUSet.from_mask(text)
    except CPUSetParseError as exc:
        assert exc.text == text
    else:
        assert CPUSet.from_mask(result.to_mask()) == result
