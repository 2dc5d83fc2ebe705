"""Record classes: a class's annotated fields make its `__init__`, `__repr__` and `__eq__` (frozen: its
`__hash__` and a guard on assignment), as the standard `dataclasses` would, at a fraction of the cost.

Why not `dataclasses`: every run's supervisor makes about forty such classes before it starts the
program. The standard module imports `inspect` (with `ast`, `dis`, `tokenize`, `enum`: 14 ms of CPU
on 3.11) and compiles each method of each class on its own (18-46 ms for those forty); that was a
third of what a run costs over plain python. This module imports only built-in modules and
compiles one method a class, `__init__` (the one that runs often), and only once the class has had a
few dozen instances; the others are closures over the field names. Compiling the forty-five `__init__`s of an
empty run's start was 6 ms; a third of those classes never has an instance in such a run (the GPU's, the
forecast's, the sensors' that are not there), and most of the others one or two (`Options`, whose
`__init__` alone took 1.4 ms to compile at a cold start). It makes what energyprof uses, with the standard
module's meaning: defaults and default factories (a mutable default is refused), `frozen`, `eq`, `repr`, `slots`, `__post_init__`,
`ClassVar` annotations left out, fields inherited from a record base, methods the class writes itself
kept; and `fields()`, `replace()` and `asdict()` to read them.
"""

from __future__ import annotations

import sys
from _operator import attrgetter  # built in: no file of the program's (an operator.py) can stand in for it

TYPE_CHECKING = False  # typing's names are for type checkers alone here: nothing imported that does not run
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar

    _T = TypeVar("_T")

_FIELDS = "__record_fields__"


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """An assignment to a field of a frozen record."""


class Field:
    """One field: its name, and its default or the factory that makes one (else MISSING)."""

    __slots__ = ("name", "default", "default_factory")

    def __init__(self, default: Any = MISSING, default_factory: Any = MISSING, name: str = "") -> None:
        self.name = name
        self.default = default
        self.default_factory = default_factory

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, default_factory={self.default_factory!r})"


def field(*, default: Any = MISSING, default_factory: Callable[[], Any] | Any = MISSING) -> Any:
    """A field's default, or the factory that makes a fresh one for each instance."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("a field takes a default or a default_factory, not both")
    return Field(default, default_factory)


def record(cls: type[_T] | None = None, /, *, frozen: bool = False, eq: bool = True, repr: bool = True,
           slots: bool = False) -> Any:
    """Make `cls` a record: `@record` or `@record(frozen=True, ...)`, as `@dataclass` is written."""
    def wrap(c: type[_T]) -> type[_T]:
        return _make(c, frozen=frozen, eq=eq, with_repr=repr, slots=slots)
    return wrap if cls is None else wrap(cls)


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields of a record class or instance, in order."""
    found = getattr(obj, _FIELDS, None)
    if found is None:
        raise TypeError(f"{obj!r} is not a record")
    return tuple(found.values())


def replace(obj: _T, /, **changes: Any) -> _T:
    """A new record like `obj` with `changes`, made by its `__init__` (so `__post_init__` runs)."""
    values = {f.name: getattr(obj, f.name) for f in fields(obj) if f.name not in changes}
    values.update(changes)
    return obj.__class__(**values)  # type: ignore[call-arg]


def asdict(obj: Any) -> dict[str, Any]:
    """A record as a dict, records, lists, tuples and dicts inside it turned too (other values shared)."""
    if isinstance(obj, type) or not hasattr(type(obj), _FIELDS):
        raise TypeError(f"asdict() takes a record instance, not {obj!r}")
    return _plain(obj)


def _plain(value: Any) -> Any:
    if hasattr(type(value), _FIELDS):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_plain(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_plain(k), _plain(v)) for k, v in value.items())
    return value


def _is_classvar(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    typing = sys.modules.get("typing")
    return typing is not None and (annotation is typing.ClassVar
                                   or getattr(annotation, "__origin__", None) is typing.ClassVar)


def _collect(cls: type) -> dict[str, Field]:
    found: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        found.update(base.__dict__.get(_FIELDS, {}))
    own = cls.__dict__.get("__annotations__")
    if own is None and "__annotate__" in cls.__dict__:  # 3.14's lazy annotations: made on first reading
        own = cls.__annotations__
    for name, annotation in (own or {}).items():
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        f = Field(value.default, value.default_factory, name) if isinstance(value, Field) else Field(value, MISSING, name)
        if f.default is not MISSING and type(f.default).__hash__ is None:
            raise ValueError(f"mutable default {type(f.default).__name__} for field {name} is not allowed:"
                             " use default_factory")
        if f.default is MISSING:
            if name in cls.__dict__:
                delattr(cls, name)
        else:
            setattr(cls, name, f.default)
        found[name] = f
    return found


def _init_source(fs: list[Field], ns: dict[str, Any], *, frozen: bool, post_init: bool) -> str:
    """`__init__`'s source, the one method compiled (the others are closures over the field names:
    only `__init__` runs often enough for its speed to matter). The names it reads from `ns` start
    with `__r_`, which no field may. Made (and its fields checked) when the class is; compiled when the
    class is first instantiated (`_first_init`)."""
    params, body = ["self"], []
    seen_default = False
    for i, f in enumerate(fs):
        if f.name == "self" or f.name.startswith("__r_"):
            raise TypeError(f"a record field may not be named {f.name!r}")
        value = f.name
        has_default = f.default is not MISSING or f.default_factory is not MISSING
        if f.default_factory is not MISSING:
            ns[f"__r_f{i}"] = f.default_factory
            params.append(f"{f.name}=__r_missing")
            value = f"__r_f{i}() if {f.name} is __r_missing else {f.name}"
        elif has_default:
            ns[f"__r_d{i}"] = f.default
            params.append(f"{f.name}=__r_d{i}")
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        else:
            params.append(f.name)
        seen_default = seen_default or has_default
        body.append(f"    __r_set(self, {f.name!r}, {value})" if frozen else f"    self.{f.name} = {value}")
    if post_init:
        body.append("    self.__post_init__()")
    return "\n".join([f"def __init__({', '.join(params)}):", *(body or ["    pass"])])


def _methods(cls: type, names: tuple[str, ...], *, frozen: bool, eq: bool, with_repr: bool,
             hashed: bool) -> dict[str, Any]:
    values = attrgetter(*names) if len(names) > 1 else (
        (lambda self: (getattr(self, names[0]),)) if names else (lambda self: ()))
    made: dict[str, Any] = {}

    if with_repr:
        def __repr__(self: Any) -> str:
            shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
            return f"{self.__class__.__qualname__}({shown})"
        made["__repr__"] = __repr__
    if eq:
        def __eq__(self: Any, other: Any) -> Any:
            if other.__class__ is self.__class__:
                return values(self) == values(other)
            return NotImplemented
        made["__eq__"] = __eq__
    if hashed:
        def __hash__(self: Any) -> int:
            return hash(values(self))
        made["__hash__"] = __hash__
    if frozen:
        frozen_names = frozenset(names)

        def __setattr__(self: Any, name: str, value: Any) -> None:
            if self.__class__ is cls or name in frozen_names:
                raise FrozenInstanceError(f"cannot assign to field {name!r}")
            super(cls, self).__setattr__(name, value)

        def __delattr__(self: Any, name: str) -> None:
            if self.__class__ is cls or name in frozen_names:
                raise FrozenInstanceError(f"cannot delete field {name!r}")
            super(cls, self).__delattr__(name)
        made["__setattr__"], made["__delattr__"] = __setattr__, __delattr__
    return made


def _make(cls: type[_T], *, frozen: bool, eq: bool, with_repr: bool, slots: bool) -> type[_T]:
    found = _collect(cls)
    if slots:
        cls = _slotted(cls, found)
    own = cls.__dict__
    class_hash = own.get("__hash__", MISSING)
    explicit_hash = not (class_hash is MISSING or (class_hash is None and "__eq__" in own))
    ns: dict[str, Any] = {"__r_missing": MISSING, "__r_set": object.__setattr__}
    post_init = hasattr(cls, "__post_init__")
    source = _init_source(list(found.values()), ns, frozen=frozen, post_init=post_init)
    plan = _Plan(tuple(found.values()), frozen=frozen, post_init=post_init)
    methods = {"__init__": _first_init(cls, source, ns, plan),
               **_methods(cls, tuple(found), frozen=frozen, eq=eq, with_repr=with_repr,
                          hashed=eq and frozen and not explicit_hash)}
    for name, method in methods.items():
        if name in own and not (name == "__hash__" and own[name] is None):
            if name in ("__setattr__", "__delattr__"):
                raise TypeError(f"frozen record {cls.__qualname__} defines {name}")
            continue
        method.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, method)
    if eq and not frozen and not explicit_hash:
        cls.__hash__ = None  # type: ignore[assignment] - mutable and compared by value: unhashable
    setattr(cls, _FIELDS, found)
    cls.__match_args__ = tuple(found)  # type: ignore[attr-defined]
    return cls


#: instances a record class makes before its `__init__` is compiled. A compile costs 40-230 us warm and 1.4 ms
#: for the process's first (the compiler's own start: an empty run's only one was a 3-line `__init__`); the
#: plan makes an instance 0.4-1.1 us slower than compiled code. So a class of an empty run (at most 8 instances
#: each) never pays one, and a busy class pays its compile back within a few hundred instances.
COMPILE_AT = 64


class _Plan:
    """What the compiled `__init__` does, read field by field, for a class's first instances: a call that binds
    as the compiled one's would (every required field given, no unknown or repeated name, not too many
    arguments) sets the same values in the same order; any other call goes to the compiled one, which raises
    its own TypeError."""

    __slots__ = ("fields", "index", "required", "frozen", "post_init")

    def __init__(self, fs: tuple[Field, ...], *, frozen: bool, post_init: bool) -> None:
        self.fields = tuple((f.name, f.default, f.default_factory) for f in fs)
        self.index = {f.name: i for i, f in enumerate(fs)}
        self.required = tuple((i, f.name) for i, f in enumerate(fs)
                              if f.default is MISSING and f.default_factory is MISSING)
        self.frozen, self.post_init = frozen, post_init

    def run(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Set `obj`'s fields from the call; False (and nothing done) for a call that does not bind."""
        given = len(args)
        if given > len(self.fields):
            return False
        index = self.index
        for name in kwargs:
            at = index.get(name)
            if at is None or at < given:
                return False
        for at, name in self.required:
            if at >= given and name not in kwargs:
                return False
        put = object.__setattr__ if self.frozen else setattr
        for at, (name, default, factory) in enumerate(self.fields):
            if at < given:
                value = args[at]
            elif name in kwargs:
                value = kwargs[name]
            elif default is not MISSING:
                value = default
            else:
                value = MISSING
            if value is MISSING and factory is not MISSING:  # (MISSING given: the factory's, as compiled)
                value = factory()
            put(obj, name, value)
        if self.post_init:
            obj.__post_init__()
        return True


def _first_init(cls: type, source: str, ns: dict[str, Any], plan: _Plan) -> Callable[..., None]:
    """The class's `__init__` until it is compiled: its first COMPILE_AT - 1 instances are made by `plan`;
    then (or at the first call that does not bind) it compiles the real one from `source`, puts it in the
    class's place of its own (a subclass's instance may come first) and runs it; every later instance runs
    the compiled one directly."""
    made_here = [0]

    def __init__(self: Any, /, *args: Any, **kwargs: Any) -> None:  # `self=` too goes to the compiled one
        made_here[0] += 1
        if made_here[0] < COMPILE_AT and plan.run(self, args, kwargs):
            return
        exec(compile(source, f"<record {cls.__qualname__}>", "exec"), ns)  # noqa: S102 - our own source
        made = ns["__init__"]
        made.__qualname__ = f"{cls.__qualname__}.__init__"
        if cls.__dict__.get("__init__") is __init__:  # (two threads' instances may compile it twice, alike)
            cls.__init__ = made  # type: ignore[misc]
        made(self, *args, **kwargs)
    return __init__


def _slotted(cls: type[_T], found: dict[str, Field]) -> type[_T]:
    """The class made again with `__slots__` for its own fields (a class's slots are fixed when it is made)."""
    body = dict(cls.__dict__)
    inherited = {name for base in cls.__mro__[1:-1] for name in base.__dict__.get("__slots__", ())}
    body["__slots__"] = tuple(name for name in found if name not in inherited)
    for name in (*body["__slots__"], "__dict__", "__weakref__"):
        body.pop(name, None)
    made = type(cls)(cls.__name__, cls.__bases__, body)
    made.__qualname__ = cls.__qualname__
    return made
