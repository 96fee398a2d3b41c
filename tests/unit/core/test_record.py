"""`corepin.core.record`: records behave like frozen slotted dataclasses, without their cost."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corepin.core.record import FrozenInstanceError, field, fields, record, replace


@record
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = field(default=(), compare=False)
    kind: ClassVar[str] = "point"

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


@dataclasses.dataclass(frozen=True, slots=True)
class PointDC:
    x: int
    y: int = 0
    tags: tuple[str, ...] = dataclasses.field(default=(), compare=False)


@record
class Bag:
    items: list[int] = field(default_factory=list)
    total: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", sum(self.items))


@record
class Labelled(Point):
    label: str = ""


@record(frozen=False, kw_only=True)
class Counter:
    name: str
    count: int = 0


def test_construction_defaults_methods_and_class_variables() -> None:
    p = Point(3, -4)
    assert (p.x, p.y, p.tags) == (3, -4, ())
    assert Point(x=1) == Point(1, 0) == Point(1, y=0)
    assert p.norm1() == 7 and Point.kind == "point" and "kind" not in [f.name for f in fields(p)]
    assert repr(p) == "Point(x=3, y=-4, tags=())"
    assert not hasattr(p, "__dict__"), "records have slots"
    assert Point.__match_args__ == ("x", "y", "tags")


def test_records_are_frozen_and_hash_by_value_on_compared_fields() -> None:
    p = Point(1, 2, ("a",))
    with pytest.raises(FrozenInstanceError):
        p.x = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.y  # type: ignore[misc]
    assert p == Point(1, 2, ("b",)), "a field with compare=False does not count"
    assert hash(p) == hash(Point(1, 2)) and len({p, Point(1, 2), Point(2, 1)}) == 2
    assert p != PointDC(1, 2), "different classes never compare equal"


def test_default_factories_post_init_and_init_false_fields() -> None:
    a, b = Bag(), Bag()
    assert a.items is not b.items, "each instance gets a new default"
    assert Bag([1, 2, 3]).total == 6
    with pytest.raises(TypeError, match="unexpected keyword argument 'total'"):
        Bag(total=3)  # type: ignore[call-arg]
    assert replace(Bag([1]), items=[4, 5]).total == 9, "replace runs __post_init__ again"


def test_inheritance_keyword_only_and_mutable_records() -> None:
    labelled = Labelled(1, 2, label="l")
    assert [f.name for f in fields(Labelled)] == ["x", "y", "tags", "label"]
    assert labelled.norm1() == 3 and isinstance(labelled, Point)
    c = Counter(name="c")
    c.count += 1
    assert c.count == 1 and Counter.__hash__ is None
    with pytest.raises(TypeError, match="takes 0 positional"):
        Counter("c")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Point(), "missing required argument 'x'"),
        (lambda: Point(1, 2, (), 4), "takes 3 positional arguments but 4 were given"),
        (lambda: Point(1, x=2), "multiple values for argument 'x'"),
        (lambda: Point(1, z=2), "unexpected keyword argument 'z'"),
        (lambda: replace(Point(1), z=3), "has no field 'z'"),
    ],
    ids=["missing", "too many positional", "duplicate", "unknown keyword", "replace unknown"],
)
def test_wrong_construction_is_a_type_error_naming_the_argument(call: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        call()  # type: ignore[operator]


def test_a_required_field_after_a_default_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="non-default field 'b'"):

        @record
        class Bad:
            a: int = 0
            b: int


values = st.integers(-5, 5)


@given(x=values, y=st.one_of(st.none(), values), tags=st.lists(st.text(max_size=2), max_size=2))
def test_records_agree_with_the_equivalent_dataclass(
    x: int, y: int | None, tags: list[str]
) -> None:
    kwargs = {} if y is None else {"y": y}
    mine = Point(x, tags=tuple(tags), **kwargs)
    theirs = PointDC(x, tags=tuple(tags), **kwargs)
    assert (mine.x, mine.y, mine.tags) == (theirs.x, theirs.y, theirs.tags)
    assert repr(mine).removeprefix("Point") == repr(theirs).removeprefix("PointDC")
    other = Point(y if y is not None else 0, x)
    other_dc = PointDC(y if y is not None else 0, x)
    assert (mine == other) == (theirs == other_dc)
    assert replace(mine, y=x).y == dataclasses.replace(theirs, y=x).y


def test_defining_records_does_not_load_dataclasses_or_inspect() -> None:
    code = (
        "import sys\n"
        "from corepin.core.record import record\n"
        "@record\n"
        "class A:\n"
        "    a: int\n"
        "print('dataclasses' in sys.modules, 'inspect' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
