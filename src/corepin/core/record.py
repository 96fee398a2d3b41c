"""`@record`: immutable value classes that cost nothing to define.

`dataclasses` writes the source of every method of every class and compiles it with `exec`,
about a millisecond per class, and pulls in `inspect` (with `ast`, `dis`, `tokenize`). On the
path of `corepin run` forty such classes cost a third of its start-up. `record` builds the
same kind of class - slots, keyword or positional construction with defaults, a
`__post_init__` hook, value equality and hash, a readable repr, frozen attributes - from
generic methods that read a per-class field table, so defining a class is a loop over its
annotations. Type checkers see it as a dataclass (`typing.dataclass_transform`).

```python
@record
class Span:
    lo: int
    hi: int = 0
    tags: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:  # validate, or fill in derived fields
        if self.hi < self.lo:
            object.__setattr__(self, "hi", self.lo)

replace(Span(1), hi=3)     # Span(lo=1, hi=3, tags=())
```

Options: `frozen` (default True), `eq` (True), `repr` (True), `slots` (True), `kw_only`
(False). `field(default=, default_factory=, init=, repr=, compare=, kw_only=)` as in
dataclasses. A record may extend another record (its fields come first). Fields annotated
`ClassVar[...]` are class attributes, not fields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["FrozenInstanceError", "field", "fields", "record", "replace"]

T = TypeVar("T")


class FrozenInstanceError(AttributeError):
    """Assigning to a field of a frozen record."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class Field:
    """One field of a record (what `fields()` returns)."""

    __slots__ = ("compare", "default", "default_factory", "init", "kw_only", "name", "repr")

    def __init__(
        self,
        default: Any = MISSING,
        default_factory: Any = MISSING,
        init: bool = True,
        repr: bool = True,
        compare: bool = True,
        kw_only: Any = MISSING,
    ) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("a field cannot have both a default and a default_factory")
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare
        self.kw_only = kw_only

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING or self.default_factory is not MISSING

    def make_default(self) -> Any:
        return self.default_factory() if self.default_factory is not MISSING else self.default

    def __repr__(self) -> str:
        return f"Field({self.name!r})"


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    init: bool = True,
    repr: bool = True,
    compare: bool = True,
    kw_only: bool | Any = MISSING,
) -> Any:
    """Options of one field (see the module docstring)."""
    return Field(default, default_factory, init, repr, compare, kw_only)


_FIELDS = "__record_fields__"
_OPTIONS = "__record_options__"


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in order."""
    found: tuple[Field, ...] | None = getattr(obj, _FIELDS, None)
    if found is None:
        raise TypeError(f"{obj!r} is not a record")
    return found


def _is_classvar(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar", "Final", "typing.Final"))


def _own_annotations(cls: type) -> dict[str, Any]:
    """The annotations written in `cls` itself (not in its bases), as strings under
    `from __future__ import annotations`. Read from the class dict: `inspect.get_annotations`
    would load `inspect`, which is what records avoid."""
    found: dict[str, Any] = cls.__dict__.get("__annotations__", {})  # noqa: RUF063
    return found


def _collect(cls: type, kw_only_default: bool) -> list[Field]:
    inherited: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in getattr(base, _FIELDS, ()):
            inherited[f.name] = f
    own: dict[str, Field] = {}
    for name, annotation in _own_annotations(cls).items():
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name = name
        if f.kw_only is MISSING:
            f.kw_only = kw_only_default
        own[name] = f
    merged = {**inherited, **own}
    return list(merged.values())


def _build_init(cls_name: str, table: tuple[Field, ...], post_init: bool) -> Callable[..., None]:
    positional = [f for f in table if f.init and not f.kw_only]
    init_fields = [f for f in table if f.init]
    derived = [f for f in table if not f.init and f.has_default]
    seen_default = False
    for f in positional:
        if f.has_default:
            seen_default = True
        elif seen_default:
            raise TypeError(f"{cls_name}: non-default field {f.name!r} follows a default one")
    names = [f.name for f in positional]
    count = len(positional)
    known = {f.name for f in init_fields}
    # the fields left to fill from keywords or defaults once n positional arguments are given
    rest = [
        [(f.name, f) for f in init_fields if f.kw_only or names.index(f.name) >= n]
        for n in range(count + 1)
    ]
    setter = object.__setattr__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = len(args)
        if given > count:
            raise TypeError(
                f"{cls_name}() takes {count} positional arguments but {given} were given"
            )
        for i in range(given):
            name = names[i]
            if name in kwargs:
                raise TypeError(f"{cls_name}() got multiple values for argument {name!r}")
            setter(self, name, args[i])
        used = 0
        for name, f in rest[given]:
            if name in kwargs:
                setter(self, name, kwargs[name])
                used += 1
            elif f.default_factory is not MISSING:
                setter(self, name, f.default_factory())
            elif f.default is not MISSING:
                setter(self, name, f.default)
            else:
                raise TypeError(f"{cls_name}() missing required argument {name!r}")
        if used != len(kwargs):
            unknown = [k for k in kwargs if k not in known]
            raise TypeError(
                f"{cls_name}() got an unexpected keyword argument {(unknown or list(kwargs))[0]!r}"
            )
        for f in derived:
            setter(self, f.name, f.make_default())
        if post_init:
            self.__post_init__()

    return __init__


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen record")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r} of a frozen record")


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in type(self).__record_compare__)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash((self.__class__.__name__, *_values(self)))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__record_repr__)
    return f"{type(self).__qualname__}({shown})"


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(
    *,
    frozen: bool = True,
    eq: bool = True,
    repr: bool = True,
    slots: bool = True,
    kw_only: bool = False,
) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(
    cls: type[T] | None = None,
    /,
    *,
    frozen: bool = True,
    eq: bool = True,
    repr: bool = True,
    slots: bool = True,
    kw_only: bool = False,
) -> type[T] | Callable[[type[T]], type[T]]:
    """Make `cls` a record (see the module docstring)."""

    def wrap(target: type[T]) -> type[T]:
        return _make(target, frozen=frozen, eq=eq, repr=repr, slots=slots, kw_only=kw_only)

    return wrap if cls is None else wrap(cls)


def _make(
    cls: type[T], *, frozen: bool, eq: bool, repr: bool, slots: bool, kw_only: bool
) -> type[T]:
    table = tuple(_collect(cls, kw_only))
    namespace = dict(cls.__dict__)
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    own_names = {f.name for f in table if f.name in _own_annotations(cls)}
    for name in own_names:
        namespace.pop(name, None)  # defaults live in the field table, not as class attributes
    if slots:
        inherited_slots = {s for base in cls.__mro__[1:] for s in getattr(base, "__slots__", ())}
        namespace["__slots__"] = tuple(f.name for f in table if f.name not in inherited_slots)
    namespace[_FIELDS] = table
    namespace["__record_compare__"] = tuple(f.name for f in table if f.compare)
    namespace["__record_repr__"] = tuple(f.name for f in table if f.repr)
    namespace["__match_args__"] = tuple(f.name for f in table if f.init and not f.kw_only)
    namespace["__init__"] = _build_init(cls.__name__, table, "__post_init__" in dir(cls))
    if repr and "__repr__" not in cls.__dict__:
        namespace["__repr__"] = _repr
    if eq and "__eq__" not in cls.__dict__:
        namespace["__eq__"] = _eq
        if "__hash__" not in cls.__dict__ or cls.__dict__["__hash__"] is None:
            namespace["__hash__"] = _hash if frozen else None
    if frozen:
        namespace["__setattr__"] = _frozen_setattr
        namespace["__delattr__"] = _frozen_delattr
    metaclass: Any = type(cls)
    made: type[T] = metaclass(cls.__name__, cls.__bases__, namespace)
    made.__qualname__ = cls.__qualname__
    made.__module__ = cls.__module__
    return made


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of record `obj` with some fields changed (constructed, so validated, again)."""
    table = fields(obj)
    args: dict[str, Any] = {}
    for f in table:
        if not f.init:
            if f.name in changes:
                raise ValueError(f"field {f.name!r} is not set by the constructor")
            continue
        args[f.name] = changes.pop(f.name) if f.name in changes else getattr(obj, f.name)
    if changes:
        raise TypeError(f"{type(obj).__name__} has no field {next(iter(changes))!r}")
    return type(obj)(**args)
