"""typing's class-making names as run time needs them: `NamedTuple`, `Generic`, `TypeVar`, `Protocol`.

Why: every run's supervisor makes about thirty named tuples and a few generic classes before it
starts the program. `typing` costs 2.7 ms of CPU to import here, and its `NamedTuple` checks each
field's annotation on its own (compiling each as a forward reference: about 0.15 ms a class). These
make the same classes from `collections.namedtuple` and plain classes, with the standard meaning
for what energyprof writes: fields from annotations, defaults, docstrings and methods the class
writes itself, `_replace` and `_fields`. Type checkers read typing's own names instead:

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple
    else:
        from ..hints import NamedTuple
"""

from __future__ import annotations

import sys
from collections import namedtuple as _namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Names a named tuple's class body may not set: they would break the tuple (as typing refuses them).
_PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                         "_make", "_replace", "_asdict", "_source"})
# Set on the made class by namedtuple itself, or read here.
_SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})


class _NamedTupleMeta(type):
    def __new__(mcs, typename: str, bases: tuple[type, ...], ns: dict[str, Any]) -> Any:
        if not bases:  # NamedTuple itself
            return super().__new__(mcs, typename, bases, ns)
        annotations: dict[str, Any] = ns.get("__annotations__", {})
        if not annotations and sys.version_info >= (3, 14):  # lazy annotations (a module without the future import)
            import annotationlib

            annotate = annotationlib.get_annotate_from_class_namespace(ns)
            if annotate is not None:
                annotations = annotationlib.call_annotate_function(annotate, annotationlib.Format.FORWARDREF)
        fields = list(annotations)
        defaults = []
        for name in fields:
            if name in ns:
                defaults.append(ns[name])
            elif defaults:
                raise TypeError(f"non-default namedtuple field {name} cannot follow default field"
                                f"{'s' if len(defaults) > 1 else ''} {', '.join(fields[:len(defaults)])}")
        made = _namedtuple(typename, fields, defaults=defaults, module=ns["__module__"])
        made.__annotations__ = dict(annotations)
        for key, value in ns.items():
            if key in _PROHIBITED:
                raise AttributeError(f"cannot overwrite NamedTuple attribute {key}")
            if key not in _SPECIAL and key not in annotations:
                setattr(made, key, value)
        return made


class NamedTuple(metaclass=_NamedTupleMeta):
    """`class Point(NamedTuple): x: int; y: int = 0` makes a `collections.namedtuple`, as typing's does."""


class Generic:
    """A base that takes type parameters (`Generic[T]`) and keeps none of them."""

    __slots__ = ()

    def __class_getitem__(cls, params: Any) -> Any:
        return cls


class Protocol:
    """A structural type for checkers; at run time a plain base with nothing of its own."""

    __slots__ = ()


def TypeVar(name: str, *constraints: Any, **options: Any) -> Any:  # noqa: N802 - typing's name
    """A type parameter's name: what `Generic[...]` here is given and ignores."""
    return name
