"""A code object's qualified name (`Class.method`, `outer.<locals>.inner`) on every Python.

Python 3.11+ code objects carry it (`co_qualname`). Python 3.10's know only their bare name, so
there the name is found once per code object, from the first frame seen running it, and kept:
- the class, in the MRO of its first argument (`self`, `cls`), whose attribute is this code;
- else the code whose constants hold this one (a nested function, a comprehension, a method of a
  class body), named first: stacks are learnt outermost first;
- else the module-level function of that name.
A code never seen in a frame keeps its bare name. Stdlib-only: it runs inside the program.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

__all__ = ["qualname", "learn", "learn_function"]

if sys.version_info >= (3, 11):

    def qualname(code: CodeType) -> str:
        return code.co_qualname

    def learn(frame: FrameType | None) -> None:
        """Nothing to learn: the code objects know their names."""

    def learn_function(func: Callable[..., Any]) -> None:
        """Nothing to learn: the code objects know their names."""

else:
    _CO_NEWLOCALS = 0x2  # a function's code (a class body or a module has no fast locals)
    # id(code) -> (code, name). Keyed by identity: 3.10's code objects compare equal by content,
    # and two identical methods of two classes are two names. The code is held so its id stays its.
    _known: dict[int, tuple[CodeType, str]] = {}
    # id(code) -> (code, prefix): a code found among the constants of a named one.
    _prefixes: dict[int, tuple[CodeType, str]] = {}

    def qualname(code: CodeType) -> str:
        hit = _known.get(id(code))
        if hit is not None:
            return hit[1]
        pre = _prefixes.get(id(code))
        return pre[1] + code.co_name if pre is not None else code.co_name

    def learn(frame: FrameType | None) -> None:
        """Name every code on this stack that has no name yet (once per code object), outermost
        first: a function defined by any code above it on the stack (its caller, or the caller of a
        decorator's wrapper) is then named under that code."""
        chain: list[FrameType] = []
        while frame is not None:
            if id(frame.f_code) not in _known:
                chain.append(frame)
            frame = frame.f_back
        for f in reversed(chain):
            if id(f.f_code) not in _known:
                _name(f.f_code, f)

    def learn_function(func: Callable[..., Any]) -> None:
        code = getattr(func, "__code__", None)
        name = getattr(func, "__qualname__", None)
        if isinstance(code, CodeType) and isinstance(name, str) and id(code) not in _known:
            _keep(code, name)

    def _keep(code: CodeType, name: str) -> str:
        _known[id(code)] = (code, name)
        _adopt(code, name)
        return name

    def _adopt(code: CodeType, name: str) -> None:
        """What `code` defines is named under it: a function's inner functions as
        `name.<locals>.inner`, a module's as `inner`, a class body's methods as `Class.method`."""
        if code.co_name == "<module>":
            prefix = ""
        elif code.co_flags & _CO_NEWLOCALS:
            prefix = name + ".<locals>."
        else:
            prefix = name + "."
        for const in code.co_consts:
            if isinstance(const, CodeType) and id(const) not in _known:
                _prefixes[id(const)] = (const, prefix)
                if not const.co_flags & _CO_NEWLOCALS:  # a class body: it never runs again to be seen
                    _adopt(const, prefix + const.co_name)

    def _name(code: CodeType, frame: FrameType) -> str:
        pre = _prefixes.get(id(code))
        if pre is not None:
            return _keep(code, pre[1] + code.co_name)
        found = _from_first_argument(code, frame)
        if found is None:
            func = frame.f_globals.get(code.co_name)
            if _code(func) is code:
                found = func.__qualname__  # type: ignore[union-attr]
        return _keep(code, found if isinstance(found, str) else code.co_name)

    def _from_first_argument(code: CodeType, frame: FrameType) -> str | None:
        if not code.co_argcount or not code.co_flags & _CO_NEWLOCALS:
            return None
        try:
            # Read once per code object: 3.10 builds the frame's locals dict to answer.
            obj = frame.f_locals.get(code.co_varnames[0])
        except Exception:  # noqa: BLE001 - a frame that cannot show its locals: no class to find
            return None
        classes = list(type(obj).__mro__)
        if isinstance(obj, type):
            classes = list(obj.__mro__) + classes
        name = code.co_name
        for klass in classes:
            attrs = getattr(klass, "__dict__", {})
            key = name
            if name.startswith("__") and not name.endswith("__"):
                key = "_" + klass.__name__.lstrip("_") + name  # a private name, mangled
            func = _unwrapped(attrs.get(key), code)
            if func is not None:
                return func.__qualname__
        return None

    def _unwrapped(attr: Any, code: CodeType) -> Any:
        """The function behind a class attribute (a plain, static or class method, a property's
        accessors, a decorated function's `__wrapped__`) whose code is `code`; or None."""
        todo = [attr]
        for _ in range(8):
            if not todo:
                return None
            item = todo.pop()
            if item is None:
                continue
            if _code(item) is code:
                return item
            todo.extend(getattr(item, a, None) for a in ("__func__", "fget", "fset", "fdel", "func", "__wrapped__"))
        return None

    def _code(func: Any) -> CodeType | None:
        code = getattr(func, "__code__", None)
        return code if isinstance(code, CodeType) else None
