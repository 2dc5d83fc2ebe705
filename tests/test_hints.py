"""energyprof.hints: typing's class-making names at run time, with the standard meaning for what they make."""

from __future__ import annotations

import typing

import pytest

from energyprof import hints


class _Point(hints.NamedTuple):
    """A point."""

    x: int
    y: int = 0
    label: str = "p"

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


class _StdPoint(typing.NamedTuple):
    """A point."""

    x: int
    y: int = 0
    label: str = "p"

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)


def test_a_named_tuple_is_what_typings_makes() -> None:
    for cls in (_Point, _StdPoint):
        p = cls(3, -4)
        assert p == (3, -4, "p") and p.norm1() == 7 and p.label == "p"
        assert cls._fields == ("x", "y", "label") and cls._field_defaults == {"y": 0, "label": "p"}
        assert p._replace(label="q") == cls(3, -4, "q") and p._asdict() == {"x": 3, "y": -4, "label": "p"}
        assert cls.__doc__ == "A point." and cls.__module__ == __name__ and cls.__qualname__.endswith("Point")
        assert list(cls.__annotations__) == ["x", "y", "label"]
        assert isinstance(p, tuple) and not isinstance(p, hints.NamedTuple)
        with pytest.raises(AttributeError):
            p.x = 1  # type: ignore[misc]
    assert repr(_Point(1, 2)) == "_Point(x=1, y=2, label='p')" == repr(_StdPoint(1, 2)).replace("_StdPoint", "_Point")
    assert tuple.__new__(_Point, (1, 2, "z")).label == "z"  # the supervisor's fast path
    assert issubclass(_Point, tuple) and _Point.__bases__ == (tuple,)


def test_a_named_tuple_refuses_what_typing_refuses() -> None:
    with pytest.raises(TypeError, match="non-default"):
        class _Bad(hints.NamedTuple):
            a: int = 1
            b: int
    with pytest.raises(AttributeError, match="_replace"):
        class _Worse(hints.NamedTuple):
            a: int

            def _replace(self) -> None: ...


def test_a_named_tuple_without_fields_and_generic_bases() -> None:
    class _Empty(hints.NamedTuple):
        """Nothing."""
    assert _Empty() == () and _Empty._fields == ()
    T = hints.TypeVar("T")

    class _Box(hints.Generic[T]):  # type: ignore[misc]
        __slots__ = ("v",)

        def __init__(self, v: object) -> None:
            self.v = v
    assert _Box[int] is _Box and _Box(2).v == 2 and not hasattr(_Box(2), "__dict__")


def test_a_protocol_is_a_plain_base() -> None:
    class _Where(hints.Protocol):
        country: str | None

    class _Here:
        country = "FR"
    assert _Where.__mro__[-2] is hints.Protocol and _Here().country == "FR"
