"""`energy_profile`: a decorator (bare or with options) and a context manager in one name.

    @energy_profile                       def f(): ...
    @energy_profile(output="f.html")      def f(): ...
    with energy_profile(json="p.json") as prof: ...

A call made while another profile runs (a decorated function calling another, or one
called from a second thread) runs unprofiled: it is already part of the outer profile,
and charging it twice would break conservation. The wrapped function's value, exception,
generator or coroutine behave as without the decorator.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, TypeVar

from .options import Options
from .outputs import write_outputs
from .profiler import Profiler, active_profiler
from .stacks.frames import anchor_depth

F = TypeVar("F", bound=Callable[..., Any])


def _exit_status(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"status": "completed"}
    if isinstance(exc, SystemExit):
        return {"status": "exit", "code": exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)}
    return {"status": "exception", "exception": f"{type(exc).__name__}: {exc}"}


class ProfileSession:
    """The object behind `energy_profile(...)`: decorates, or profiles a `with` block."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._profiler: Profiler | None = None

    def __call__(self, func: F) -> F:
        return _decorate(func, self.options)

    def __enter__(self) -> Profiler:
        if active_profiler() is not None:
            self._profiler = None
            return active_profiler()  # type: ignore[return-value]
        self._profiler = Profiler(self.options)
        self._profiler.start(target="<with block>", _anchor=anchor_depth(sys._getframe(1)))
        return self._profiler

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._profiler is None:
            return None
        profile = self._profiler.stop(_exit_status(exc))
        write_outputs(profile, self.options)
        return None


def energy_profile(func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Profile a function (as a decorator) or a block (as a context manager)."""
    opts = Options.from_kwargs(options)
    if func is not None:
        if not callable(func):
            raise TypeError("energy_profile takes a function, or keyword options only")
        return _decorate(func, opts)
    return ProfileSession(opts)


def _run_profiled(func: Callable[..., Any], opts: Options, call: Callable[[], Any]) -> Any:
    if active_profiler() is not None:
        return call()
    prof = Profiler(opts)
    try:
        prof.start(target=getattr(func, "__qualname__", repr(func)), _anchor=anchor_depth(sys._getframe(1)))
    except RuntimeError:  # another thread started a profile between our check and start
        return call()
    exc: BaseException | None = None
    try:
        return call()
    except BaseException as e:
        exc = e
        raise
    finally:
        profile = prof.stop(_exit_status(exc))
        write_outputs(profile, opts)


def _decorate(func: F, opts: Options) -> F:
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if active_profiler() is not None:
                return await func(*args, **kwargs)
            prof = Profiler(opts)
            prof.start(target=func.__qualname__, _anchor=anchor_depth(sys._getframe(1)))
            exc: BaseException | None = None
            try:
                return await func(*args, **kwargs)
            except BaseException as e:
                exc = e
                raise
            finally:
                write_outputs(prof.stop(_exit_status(exc)), opts)

        return async_wrapper  # type: ignore[return-value]

    if inspect.isgeneratorfunction(func):
        @functools.wraps(func)
        def gen_outer(*args: Any, **kwargs: Any) -> Any:
            gen = func(*args, **kwargs)

            def driver() -> Any:
                return (yield from gen)

            return _ProfiledGenerator(driver(), func, opts)

        return gen_outer  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _run_profiled(func, opts, lambda: func(*args, **kwargs))

    return wrapper  # type: ignore[return-value]


class _ProfiledGenerator:
    """A generator whose iteration, first item to exhaustion, is one profile."""

    def __init__(self, gen: Any, func: Callable[..., Any], opts: Options) -> None:
        self._gen = gen
        self._func = func
        self._opts = opts
        self._prof: Profiler | None = None

    def __iter__(self) -> _ProfiledGenerator:
        return self

    def _step(self, op: Callable[[], Any]) -> Any:
        if self._prof is None and active_profiler() is None:
            self._prof = Profiler(self._opts)
            self._prof.start(target=self._func.__qualname__, _anchor=anchor_depth(sys._getframe(1)))
        try:
            return op()
        except BaseException as exc:
            self._finish(None if isinstance(exc, (StopIteration, GeneratorExit)) else exc)
            raise

    def _finish(self, exc: BaseException | None) -> None:
        if self._prof is not None and self._prof.running:
            write_outputs(self._prof.stop(_exit_status(exc)), self._opts)

    def __next__(self) -> Any:
        return self._step(lambda: next(self._gen))

    def send(self, value: Any) -> Any:
        return self._step(lambda: self._gen.send(value))

    def throw(self, *args: Any) -> Any:
        return self._step(lambda: self._gen.throw(*args))

    def close(self) -> None:
        try:
            self._gen.close()
        finally:
            self._finish(None)
