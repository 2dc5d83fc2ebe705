"""`energy_profile`: a decorator (bare or with options) and a context manager in one name.

    @energy_profile                       def f(): ...
    @energy_profile(output="f.html")      def f(): ...
    with energy_profile(json="p.json") as prof: ...

A call made while another profile runs (a decorated function calling another, or one
called from a second thread) runs unprofiled: it is already part of the outer profile,
and charging it twice would break conservation. The wrapped function's value, exception,
generator or coroutine behave as without the decorator, even when a report cannot be written
(that is one warning line on stderr).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..setup.options import Options
from .windows import AlreadyRunning
from ..output.writer import write_outputs
from .preflight import preflight
from .profiler import Profiler
from .profiler import expand_output_paths
from .profiler import active_profiler
from ..agent.frames import anchor_depth

if TYPE_CHECKING:  # for type checkers alone: the decorator keeps the signature it wraps
    F = TypeVar("F", bound=Callable[..., Any])


def _exit_status(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"status": "completed"}
    if isinstance(exc, SystemExit):
        return {"status": "exit", "code": exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)}
    return {"status": "exception", "exception": f"{type(exc).__name__}: {exc}"}


def _warn(what: str, exc: BaseException) -> None:
    print(f"energyprof: warning: {what}: {type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)


class _Session:
    """One profile's start and stop, shared by every form of the API.

    `start` returns False (and profiles nothing) when a profile already runs in this process or
    cannot start; `finish` stops it and writes the outputs. Neither raises: the profiled code's
    value and exception are the only things that reach the caller.
    """

    def __init__(self, options: Options, target: str) -> None:
        self.options = options
        self.target = target
        self.profiler: Profiler | None = None

    def start(self, anchor: int) -> bool:
        if active_profiler() is not None:
            return False
        prof = Profiler(self.options)
        try:
            prof.start(target=self.target, _anchor=anchor)
        except AlreadyRunning:  # lost a race with another thread: part of its profile
            return False
        except Exception as exc:  # noqa: BLE001 - the program must run either way
            _warn("could not start profiling; running unprofiled", exc)
            return False
        self.profiler = prof
        return True

    @property
    def running(self) -> bool:
        return self.profiler is not None and self.profiler.running

    def finish(self, exc: BaseException | None) -> None:
        prof, self.profiler = self.profiler, None
        if prof is None:
            return
        try:
            profile = prof.stop(_exit_status(exc), keep_checkpoint=True)
        except Exception as err:  # noqa: BLE001 - never replace the program's own outcome
            _warn("could not finish the profile", err)
            return
        if profile is None:  # a forked child: the parent's profile owns the outputs
            return
        try:
            # its paths with the placeholders expanded; the checkpoint goes once the facts are saved
            write_outputs(profile, prof.options, checkpoint=prof.options.checkpoint)
        except OSError:
            pass  # write_outputs said so, one line per output
        except Exception as err:  # noqa: BLE001
            _warn("could not write the report", err)


class ProfileFactory:
    """What `energy_profile(...)` returns: decorates a function, or profiles a `with` block."""

    def __init__(self, options: Options) -> None:
        self.options = options
        # One entry per `with` still open on this object, per thread: re-entering it (nested, or
        # from another thread) must not forget the session that is running, and one thread's exit
        # must never end the session another thread's entry started (with that thread's exception).
        self._sessions: dict[int, list[_Session | None]] = {}

    def __call__(self, func: F) -> F:
        return _decorate(func, self.options)

    def __enter__(self) -> Profiler | None:
        session = _Session(self.options, "<with block>")
        mine = self._sessions.setdefault(threading.get_ident(), [])
        if not session.start(anchor_depth(sys._getframe(1))):
            mine.append(None)  # part of the profile already running: this block does not end it
            return active_profiler()
        mine.append(session)
        return session.profiler

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        mine = self._sessions.get(threading.get_ident())
        session = mine.pop() if mine else None
        if mine is not None and not mine:
            self._sessions.pop(threading.get_ident(), None)
        if session is not None:
            session.finish(exc)
        return None


def energy_profile(func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Profile a function (as a decorator) or a block (as a context manager)."""
    opts = Options.from_kwargs(options)
    preflight(expand_output_paths(opts), keep_checkpoint=False)
    if func is not None:
        if not callable(func):
            raise TypeError("energy_profile takes a function, or keyword options only")
        return _decorate(func, opts)
    return ProfileFactory(opts)


def _decorate(func: F, opts: Options) -> F:
    target = getattr(func, "__qualname__", repr(func))
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            session = _Session(opts, target)
            if not session.start(anchor_depth(sys._getframe(1))):
                return await func(*args, **kwargs)
            exc: BaseException | None = None
            try:
                return await func(*args, **kwargs)
            except BaseException as e:
                exc = e
                raise
            finally:
                session.finish(exc)

        return async_wrapper  # type: ignore[return-value]

    if inspect.isgeneratorfunction(func):
        @functools.wraps(func)
        def gen_outer(*args: Any, **kwargs: Any) -> Any:
            gen = func(*args, **kwargs)

            def driver() -> Any:
                return (yield from gen)

            return _ProfiledGenerator(driver(), _Session(opts, target))

        return gen_outer  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        session = _Session(opts, target)
        if not session.start(anchor_depth(sys._getframe(1))):
            return func(*args, **kwargs)
        exc: BaseException | None = None
        try:
            return func(*args, **kwargs)
        except BaseException as e:
            exc = e
            raise
        finally:
            session.finish(exc)

    return wrapper  # type: ignore[return-value]


class _ProfiledGenerator:
    """A generator whose iteration, first item to exhaustion, is one profile.

    Abandoned early (`for x in gen(): break`, then dropped), it is closed by its finalizer, which
    stops the profile, so later decorated calls are profiled again.
    """

    def __init__(self, gen: Any, session: _Session) -> None:
        self._gen = gen
        self._session = session
        self._started = False

    def __iter__(self) -> _ProfiledGenerator:
        return self

    def _step(self, op: Callable[[], Any]) -> Any:
        if not self._started:
            self._started = True
            self._session.start(anchor_depth(sys._getframe(1)))
        try:
            return op()
        except BaseException as exc:
            self._session.finish(None if isinstance(exc, (StopIteration, GeneratorExit)) else exc)
            raise

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
            self._session.finish(None)

    def __del__(self) -> None:
        if self._session.profiler is not None:
            self.close()
