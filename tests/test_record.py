"""energyprof.record against the standard dataclasses: the same classes written both ways behave alike,
and a run's start makes its records without importing dataclasses."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof import record as rec

# A field: (default kind, value). Kinds: none, a default, a factory.
FIELD = st.tuples(st.sampled_from(["none", "default", "factory"]), st.integers(-5, 5))
FLAGS = st.fixed_dictionaries({"frozen": st.booleans(), "eq": st.booleans(), "repr": st.booleans()})


def _both(specs: list[tuple[str, int]], flags: dict[str, bool], slots: bool) -> tuple[type, type]:
    """One class made by dataclasses and by record from the same body (fields with defaults last)."""
    specs = sorted(specs, key=lambda s: s[0] != "none")

    def body(field: Any) -> dict[str, Any]:
        ns: dict[str, Any] = {"__annotations__": {}, "limit": 3, "__doc__": "A record."}
        ns["__annotations__"]["limit"] = "ClassVar[int]"
        for i, (kind, value) in enumerate(specs):
            ns["__annotations__"][f"f{i}"] = "int"
            if kind == "default":
                ns[f"f{i}"] = value
            elif kind == "factory":
                ns[f"f{i}"] = field(default_factory=lambda v=value: (v,))
        return ns

    std = dataclasses.dataclass(type("C", (), body(dataclasses.field)), slots=slots, **flags)
    ours = rec.record(type("C", (), body(rec.field)), slots=slots, **flags)
    return std, ours


@settings(max_examples=150, deadline=None)
@given(st.lists(FIELD, max_size=5), FLAGS, st.booleans(), st.data())
def test_a_record_behaves_as_the_same_dataclass(specs: list[tuple[str, int]], flags: dict[str, bool], slots: bool,
                                                data: st.DataObject) -> None:
    std, ours = _both(specs, flags, slots)
    assert [f.name for f in dataclasses.fields(std)] == [f.name for f in rec.fields(ours)]
    required = [f.name for f in rec.fields(ours) if f.default is rec.MISSING and f.default_factory is rec.MISSING]
    given_args = {n: data.draw(st.integers(-3, 3)) for n in required}
    extra = {f.name: data.draw(st.integers(-3, 3)) for f in rec.fields(ours) if f.name not in required
             and data.draw(st.booleans())}
    a, b = std(**given_args, **extra), ours(**given_args, **extra)
    assert dataclasses.asdict(a) == rec.asdict(b)
    if flags["repr"]:  # both name the class by its qualname and show the fields in order
        assert repr(a) == repr(b)
    else:
        assert repr(b).startswith("<") and repr(a).startswith("<")
    twin = ours(**given_args, **extra)
    assert (b == twin) == (a == std(**given_args, **extra))
    assert (std.__hash__ is None) == (ours.__hash__ is None)
    if ours.__hash__ is not None and flags["eq"]:
        assert hash(b) == hash(twin)
    if rec.fields(ours):
        name = rec.fields(ours)[0].name
        before = getattr(b, name)
        changed = rec.replace(b, **{name: 99})
        assert getattr(changed, name) == 99 and getattr(b, name) == before
        assert [getattr(changed, f.name) for f in rec.fields(ours)[1:]] == [getattr(b, f.name) for f in rec.fields(ours)[1:]]
        if flags["frozen"]:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(a, name, 1)
            with pytest.raises(rec.FrozenInstanceError):
                setattr(b, name, 1)
            with pytest.raises(AttributeError):
                delattr(b, name)
        else:
            setattr(b, name, 7)
            assert getattr(b, name) == 7
    assert ours.limit == 3 and "limit" not in {f.name for f in rec.fields(ours)}  # a ClassVar is no field
    assert hasattr(b, "__dict__") is not slots and hasattr(a, "__dict__") is not slots


def test_defaults_factories_and_post_init() -> None:
    @rec.record
    class Run:
        """Doc."""

        name: str
        tags: list[str] = rec.field(default_factory=list)
        size: int = 2
        seen: ClassVar[int] = 0

        def __post_init__(self) -> None:
            self.size *= 10

    one, two = Run("a"), Run("b", size=3)
    assert one.tags is not two.tags and one.tags == [] and (one.size, two.size) == (20, 30)
    assert Run.__doc__ == "Doc." and Run.size == 2 and Run.__match_args__ == ("name", "tags", "size")
    assert rec.replace(two, name="c").size == 300  # made again by __init__, as dataclasses.replace does
    with pytest.raises(TypeError):
        Run()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Run("a", nope=1)  # type: ignore[call-arg]


def test_missing_given_for_a_factorys_field_gets_the_factorys_value_before_and_after_the_compile() -> None:
    """The compiled `__init__` calls a field's factory where the value given is MISSING (its parameter's
    default): so do the first instances, made before it is compiled."""
    @rec.record
    class Bag:
        n: int
        items: list[int] = rec.field(default_factory=list)

    made = [Bag(i, rec.MISSING) for i in range(2 * rec.COMPILE_AT)]
    assert all(b.items == [] for b in made) and len({id(b.items) for b in made}) == len(made)


def test_what_dataclasses_refuse_is_refused() -> None:
    with pytest.raises(ValueError, match="mutable default"):
        @rec.record
        class Bad:
            items: list[int] = []  # noqa: RUF012
    with pytest.raises(TypeError, match="follows default"):
        @rec.record
        class Order:
            a: int = 1
            b: int
    with pytest.raises(ValueError):
        rec.field(default=1, default_factory=list)
    with pytest.raises(TypeError):
        rec.fields(object())
    with pytest.raises(TypeError):
        rec.asdict(int)


def test_inherited_fields_methods_written_by_hand_and_pickling() -> None:
    b = _Child(1, 2)
    assert (b.x, b.y) == (1, 2) and [f.name for f in rec.fields(b)] == ["x", "y"]
    assert repr(b) == "hand-made" and b == _Child(1, 2) and b != _Base(1)
    assert pickle.loads(pickle.dumps(b)) == b
    frozen = _Frozen(1.5, "w")
    assert pickle.loads(pickle.dumps(frozen)) == frozen and {frozen: 1}[_Frozen(1.5, "w")] == 1
    slotted = _Slotted(3)
    assert pickle.loads(pickle.dumps(slotted)) == slotted
    assert rec.asdict(_Holder([_Base(1)], {"k": (_Base(2),)})) == {"items": [{"x": 1}], "by": {"k": ({"x": 2},)}}


@rec.record
class _Base:
    x: int


@rec.record
class _Child(_Base):
    y: int = 0

    def __repr__(self) -> str:
        return "hand-made"


@rec.record(frozen=True)
class _Frozen:
    value: float
    unit: str


@rec.record(slots=True)
class _Slotted:
    n: int


@rec.record
class _Holder:
    items: list[_Base]
    by: dict[str, tuple[_Base, ...]]


def test_a_run_makes_its_records_without_dataclasses_or_inspect(tmp_path: Any) -> None:
    """The supervisor of an empty run, report and JSON written, imports neither: the cost this module
    exists to save (inspect, ast, dis, tokenize come with dataclasses)."""
    probe = ("import atexit, json, runpy, sys\n"
             "out = sys.argv[1]\n"
             "atexit.register(lambda: json.dump(sorted(sys.modules), open(out, 'w')))\n"
             "sys.argv = ['energyprof'] + sys.argv[2:]\n"
             "runpy.run_module('energyprof', run_name='__main__', alter_sys=True)\n")
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "probe.py").write_text(probe)
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(out), "-q", "-o", str(tmp_path / "r.html"),
                           "--json", str(tmp_path / "p.json"), str(tmp_path / "empty.py")], cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and (tmp_path / "r.html").stat().st_size > 0
    loaded = set(json.loads(out.read_text()))
    # what the interpreter's own start loads (a site's .pth files) is not the run's doing
    at_start = set(json.loads(subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sorted(sys.modules)))"],
                                             capture_output=True, text=True, check=True, timeout=60).stdout))
    assert "energyprof.facts.profile" in loaded and "energyprof.record" in loaded
    assert not (loaded - at_start) & {"dataclasses", "inspect", "ast", "dis", "tokenize"}


def test_init_is_compiled_after_a_few_instances_whoever_makes_them() -> None:
    """A record's `__init__` is compiled once its class has made COMPILE_AT instances (a class with a few
    instances in a run costs no compile); they may be a plain subclass's, and the class's own `__init__` is
    the compiled one from then on. A bad call compiles it at once and fails as the compiled one's would."""
    @rec.record(frozen=True)
    class Point:
        x: int
        y: int = 0

    class Named(Point):
        pass

    def compiled(cls: type) -> bool:
        return cls.__dict__["__init__"].__code__.co_filename.startswith("<record")

    assert not compiled(Point)
    first = Named(1, y=2)
    assert not compiled(Point) and (first.x, first.y) == (1, 2) and Point(3) == Point(3, 0)
    for n in range(rec.COMPILE_AT):
        assert Named(n).x == n
    assert compiled(Point) and Point(4, 5) == Point(x=4, y=5)
    assert Point.__init__.__qualname__.endswith("Point.__init__")

    @rec.record
    class Pair:
        a: int
        b: list[int] = rec.field(default_factory=list)

    @dataclasses.dataclass
    class StdPair:
        a: int
        b: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError) as ours:
        Pair()  # type: ignore[call-arg] - the first instance, before anything is compiled
    with pytest.raises(TypeError) as std:
        StdPair()  # type: ignore[call-arg]
    assert str(ours.value).split("(", 1)[1] == str(std.value).split("(", 1)[1]  # the same message, bar the name
    assert compiled(Pair) and Pair(1) == Pair(1, []) and Pair(1).b is not Pair(1).b


# A call: positional values, then keyword names (some a field's, some not, some repeating a positional one).
CALL = st.tuples(st.lists(st.integers(-3, 3), max_size=6), st.lists(st.sampled_from([f"f{i}" for i in range(6)]
                                                                                    + ["g", "self"]), max_size=4))


@settings(max_examples=200, deadline=None)
@given(st.lists(FIELD, max_size=5), FLAGS, st.booleans(), CALL)
def test_first_instances_are_made_as_the_compiled_init_makes_them(specs: list[tuple[str, int]], flags: dict[str, bool],
                                                                  slots: bool, call: tuple[list[int], list[str]]) -> None:
    """Before its `__init__` is compiled a record class makes the same instance from any call, or fails the
    same way, as its compiled `__init__` and as the same dataclass do, a post-init and its factories called
    alike."""
    values, names = call
    kwargs = {name: i for i, name in enumerate(names)}

    def made(cls: type, fields: Any) -> Any:
        try:
            obj = cls(*values, **kwargs)
        except TypeError as exc:
            return "TypeError", str(exc).split("(", 1)[1]  # the message, bar the function's name
        return [(f.name, getattr(obj, f.name)) for f in fields(obj)]

    std, fresh = _both(specs, flags, slots)
    _, warm = _both(specs, flags, slots)
    for _ in range(rec.COMPILE_AT):  # calls that do not bind compile it too: a bad one does here
        try:
            warm(*values, **kwargs)
        except TypeError:
            pass
    assert warm.__dict__["__init__"].__code__.co_filename.startswith("<record")
    assert not fresh.__dict__["__init__"].__code__.co_filename.startswith("<record")
    assert made(fresh, rec.fields) == made(warm, rec.fields) == made(std, dataclasses.fields)
