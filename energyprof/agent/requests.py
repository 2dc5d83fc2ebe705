"""Web requests as units of work: one window per request, named by method and route template.

A request opens when a server hands it to the application and closes when its response is sent
(ASGI: the last body message; WSGI: the response's close). Its window is named the moment routing
chooses a route, `GET /items/{item_id}`, from the route's template, never from the raw path, so
the number of names is the number of routes (methods outside HTTP's own read `OTHER`, requests
no route took `GET [unmatched]`). The window begins at the request's start, as PENDING (under an
index unique in the process), so the run's energy is charged to it from its first interval however
late it is named; its end record carries its name (and OPENED_AS, the index it began under), and the
ledger names it then: a request routing named, and one it never did (a 404, a router that is not
hooked, a plain WSGI application), are charged alike.

The request is found by a context variable, set where the server calls the application: an
asyncio task and the threads anyio starts for it see their own request, and so does each thread
of a WSGI server. Nothing here stays on the program's stack while the request runs: every hook is
a plain function that returns what it wraps (a coroutine, an iterable), so the sampled stacks are
the program's own.

The sampler tells which request a sample ran (agent/units.py's `unit_of`): a request registers the frames
its work runs under on an event loop (its application's coroutine, each route's `handle`), or its thread
(a WSGI server's; a pool worker's while it runs a call the request handed it, agent/in_request.py), and
forgets them as it ends; the ledger charges its window what those samples were
charged, so requests that overlap share nothing and a request that awaits costs nothing meanwhile. A
request whose end no hook sees ends at the next request on its thread or task, its task's end, its
thread's end or the run's end, whichever comes first, and its window says which (`ENDED_BY`).

Under `python -m energyprof`, the servers and routers are hooked as they are imported (uvicorn,
hypercorn, wsgiref, waitress, gunicorn; Starlette and FastAPI routes, Flask and Django rules:
agent/autoload.py's finder, agent/request_hooks.py's wrappers), so a program serves with no change; in a program
profiled in process, `energyprof.asgi.EnergyMiddleware` and `energyprof.wsgi.EnergyMiddleware` open
the same windows (and stand aside where a server's hook has the request already). Each window's facts
hold `request=1` and the response's `status` (agent/window_facts.py names them, with the two the
ledger reads to end and name the right window and does not keep). Standard library only: the frameworks are never
imported here.
"""

from __future__ import annotations

import _thread
import atexit
import os
import sys
import time
from contextvars import ContextVar

# Names, never `from . import wire`: the agent's package is loaded by path (agent/spool.py says why).
from .units import note_endpoint, running_codes, running_frames, running_threads
from .window_facts import (
    END_NEXT, END_RUN, END_TASK, END_THREAD, ENDED_BY, OPENED_AS, PENDING, REQUEST_FACT, STATUS_FACT, WINDOW_INDEX
)
from .wire import window_begin, window_end

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

_perf = time.perf_counter_ns
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"))
UNMATCHED = "[unmatched]"


def route_name(method: Any, template: str | None) -> str:
    """A request window's name: the method (HTTP's own, which are case-sensitive, else `OTHER`) and the
    route's template (`[unmatched]` when no route took the request)."""
    known = isinstance(method, str) and method in METHODS
    return f"{method if known else 'OTHER'} {template if template else UNMATCHED}"


def status_code(status: Any) -> int:
    """A response status as a number: ASGI's int, or WSGI's "404 Not Found"; 0 when unknown."""
    if isinstance(status, int):
        return status
    if isinstance(status, str):
        head = status.split(" ", 1)[0]
        return int(head) if head.isdigit() else 0
    return 0


class Request:
    """One request while it runs: when it began, what routing named it, how it ended."""

    __slots__ = ("t0", "method", "prefix", "name", "index", "opened", "status", "sink", "done", "by_middleware",
                 "task", "frames", "thread")

    def __init__(self, method: Any, sink: Any, by_middleware: bool = False) -> None:
        self.t0 = _perf()
        self.opened = _index(PENDING)  # its window's index while it is PENDING (unique in this process)
        self.method = method
        self.prefix = ""  # the mounts' templates routing passed through, outermost first
        self.name: str | None = None
        self.index = 0
        self.status = 0
        self.sink = sink
        self.done = False
        self.by_middleware = by_middleware  # opened by an in-process middleware, not by a server's hook
        self.task: Any = None  # the asyncio task it runs in, told to end it should the application raise
        self.frames: list[int] = []  # the ids of its frames the sampler knows it by (agent/units.py)
        self.thread: int | None = None  # the thread it runs on, where that thread is its (WSGI)

    def task_done(self, _task: Any) -> None:
        """Its task ended before its response did: the application raised, and the server answered 500."""
        if not self.done:
            close_request(self, self.status or 500, END_TASK)

    def runs_in(self, frame: Any) -> None:
        """`frame` (a coroutine's) is on the stack whenever this request's work runs on an event loop."""
        if frame is not None and not self.done:
            running_frames[id(frame)] = (frame, self.opened)
            self.frames.append(id(frame))
            running_codes.setdefault(id(frame.f_code), frame.f_code)


class _ThreadEnd:
    """Held in a thread-local slot while a thread's request runs: a thread that ends with its request open
    (a server's hook never saw the response) ends the request with it."""

    __slots__ = ("req",)

    def __init__(self, req: Request) -> None:
        self.req = req

    def __del__(self) -> None:
        try:
            if not self.req.done:
                close_request(self.req, None, END_THREAD)
        except Exception:  # noqa: BLE001 - an interpreter shutting down: the run's end closes what is left
            pass


_current: ContextVar[Request | None] = ContextVar("energyprof_request", default=None)
_lock = _thread.allocate_lock()
_runs: dict[str, int] = {}  # each name's requests so far: a window's index
_open: dict[int, Request] = {}  # the requests running now, by the index they began under
_thread_end = _thread._local()


def _close_all() -> None:
    """The run ends (the interpreter exits) with requests still running: each ends now, said so."""
    for req in list(_open.values()):
        close_request(req, None, END_RUN)


atexit.register(_close_all)  # before the agent's own exit handler (registered earlier, run later)


def _index(name: str) -> int:
    with _lock:
        n = _runs.get(name, 0)
        _runs[name] = n + 1
    return n


def _sink() -> Any:
    """Where windows go in this process: the supervised agent, or the profile running in process
    (`energyprof.drive.profiler`); None when nothing is profiled."""
    supervised = sys.modules.get("energyprof.agent.supervised")
    agent = supervised.current() if supervised is not None else None
    if agent is not None:
        return _SpoolSink(agent)
    profiler = sys.modules.get("energyprof.drive.profiler")
    prof = profiler.active_profiler() if profiler is not None else None
    return _ProfilerSink(prof) if prof is not None and hasattr(prof, "_feed") else None


class _ProfilerSink:
    """The in-process Profiler's windows, without the I/O counters its edges read (20 us an edge)."""

    __slots__ = ("prof",)

    def __init__(self, prof: Any) -> None:
        self.prof = prof

    def begin_window(self, name: str, index: int | None = None, t_ns: int | None = None) -> None:
        self.prof.begin_window(name, index, t_ns=t_ns, edge_io=False)

    def end_window(self, name: str | None = None, facts: dict[str, float] | None = None,
                   t_ns: int | None = None) -> None:
        self.prof.end_window(name, facts, t_ns=t_ns, edge_io=False)


class _SpoolSink:
    """The supervised agent's spool, written directly: a request's edges read no I/O counters (20-35 us an
    edge, `Agent.begin_window`), so opening and closing one costs a few microseconds."""

    __slots__ = ("agent",)

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def begin_window(self, name: str, index: int | None = None, t_ns: int | None = None) -> None:
        self.agent.spool.event(window_begin(int(t_ns or _perf()), name, index))

    def end_window(self, name: str | None = None, facts: dict[str, float] | None = None,
                   t_ns: int | None = None) -> None:
        self.agent.spool.event(window_end(int(t_ns or _perf()), name, False, facts))


def open_request(method: Any, by_middleware: bool = False, on_loop: bool = False) -> Request | None:
    """A request begins on this task or thread (None when nothing is profiled): later hooks find it. On a
    thread of its own (`on_loop` False: a WSGI server's), the thread is the request's while it runs."""
    sink = _sink()
    if sink is None:
        return None
    stale = _current.get()
    if stale is not None and not stale.done:
        close_request(stale, None, END_NEXT)  # a thread's last request that ended without its hook (an error path)
    if not on_loop:
        # the thread's last request, if another context opened it (the thread-local slot is the thread's, whatever
        # the context): ended by this one, said so, never by the slot's replacement as if the thread had ended
        old = getattr(_thread_end, "slot", None)
        if old is not None and not old.req.done:
            close_request(old.req, None, END_NEXT)
    req = Request(method, sink, by_middleware)
    try:
        # the window begins now, as PENDING: every interval of the request is charged to it, and its
        # end names it (a route's, or unmatched), however late routing is or whether it ever is
        sink.begin_window(PENDING, req.opened, t_ns=req.t0)
    except Exception:  # noqa: BLE001 - a profile that has ended: the request is the program's all the same
        return None
    _current.set(req)
    _open[req.opened] = req
    if not on_loop:
        req.thread = _thread.get_ident()
        running_threads[req.thread] = req.opened
        _thread_end.slot = _ThreadEnd(req)  # the one before, closed above: its end does nothing
    return req


def current() -> Request | None:
    return _current.get()


def served() -> bool:
    """Whether a server's hook has opened the request this task or thread runs, before a middleware saw it
    (a server's hooks end or replace its requests; a middleware's request that its server never closed,
    a test client's, is replaced by the middleware's next)."""
    req = _current.get()
    return req is not None and not req.done and not req.by_middleware


def _after_fork() -> None:
    """A forked worker (gunicorn's) starts its own count; a lock another thread held stays behind."""
    global _lock
    _lock = _thread.allocate_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def name_request(req: Request | None, template: str, endpoint: object = None) -> None:
    """Routing chose `template` (and its handler, `endpoint`) for `req`: its window's name, once (its end
    writes it); the handler's stacks are rooted at the route's node (agent/units.py)."""
    if req is None or req.name is not None or req.done:
        return
    name = req.name = route_name(req.method, req.prefix + template)
    req.index = _index(name)
    if endpoint is not None:
        note_endpoint(endpoint, name)


def close_request(req: Request | None, status: Any = None, ended_by: float = 0.0) -> None:
    """The request's response is sent: its window ends now, with its status. `ended_by` (window_facts.END_*):
    no hook saw its response, and what ended it instead."""
    if req is None or req.done:
        return
    req.done = True
    t = _perf()
    _forget(req)
    if status is not None:
        req.status = status_code(status)
    try:
        if req.name is None:
            name = req.name = route_name(req.method, None)
            req.index = _index(name)
        # the window opened as PENDING under `opened` ends, and takes its name and its index in that name
        facts = {REQUEST_FACT: 1.0, STATUS_FACT: float(req.status), WINDOW_INDEX: float(req.index),
                 OPENED_AS: float(req.opened)}
        if ended_by:
            facts[ENDED_BY] = float(ended_by)
        req.sink.end_window(req.name, facts, t_ns=t)
    except Exception:  # noqa: BLE001 - as in name_request
        pass
    if _current.get() is req:
        _current.set(None)
    if req.task is not None:  # a task that outlives its request (a test client's) keeps no callback per request
        task, req.task = req.task, None
        try:
            task.remove_done_callback(req.task_done)
        except Exception:  # noqa: BLE001 - a task of another kind: its callback finds the request done
            pass


def _forget(req: Request) -> None:
    """The sampler no longer finds `req` (its frames, its thread) once it has ended."""
    _open.pop(req.opened, None)
    for key in req.frames:
        hit = running_frames.get(key)
        if hit is not None and hit[1] == req.opened:
            del running_frames[key]
    req.frames = []
    # its thread (a WSGI server's), and any pool worker still running a call it handed over (agent/in_request.py);
    # `list` copies the items at once, whatever the workers do meanwhile
    for ident, unit in list(running_threads.items()):
        if unit == req.opened:
            running_threads.pop(ident, None)


# -- ASGI ------------------------------------------------------------------------------------
class AsgiRequests:
    """An ASGI application whose HTTP requests are windows. `__call__` is a plain function that returns
    the application's coroutine, and `send` hands on the application's messages the same way, so no
    frame of energyprof's is on the stack while the request runs."""

    __slots__ = ("app",)
    MIDDLEWARE = False  # a server's own wrapper (energyprof.asgi's middleware: True)

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope.get("type") != "http" or served():
            return self.app(scope, receive, send)  # not HTTP, or the server's wrapper has the request
        req = open_request(scope.get("method"), self.MIDDLEWARE, on_loop=True)
        if req is None:
            return self.app(scope, receive, send)
        _on_task_end(req)
        coro = self.app(scope, receive, _Send(send, req, scope))
        try:
            req.runs_in(getattr(coro, "cr_frame", None))  # the application's frames run this request
        except Exception:  # noqa: BLE001 - our bookkeeping: the request runs unattributed, the server is untouched
            pass
        return coro

    def __getattr__(self, name: str) -> Any:  # the wrapped application's own attributes (a server may read them)
        if name == "app":
            raise AttributeError(name)
        return getattr(self.app, name)


def _on_task_end(req: Request) -> None:
    """An application that raised sends no response of its own (the server answers 500 itself): the
    request ends with its task, then, not with the run."""
    asyncio = sys.modules.get("asyncio")
    try:
        task = asyncio.current_task() if asyncio is not None else None
    except RuntimeError:  # no running loop (another event loop library's task)
        task = None
    if task is not None:
        task.add_done_callback(req.task_done)
        req.task = task


class _Send:
    __slots__ = ("send", "req", "scope")

    def __init__(self, send: Any, req: Request, scope: dict[str, Any]) -> None:
        self.send, self.req, self.scope = send, req, scope

    def __call__(self, message: dict[str, Any]) -> Any:
        kind = message.get("type")
        if kind == "http.response.start":
            self.req.status = status_code(message.get("status"))
        elif kind == "http.response.body" and not message.get("more_body", False):
            req = self.req
            if req.name is None:
                _name_from_scope(req, self.scope)
            close_request(req)
        return self.send(message)


def _name_from_scope(req: Request, scope: dict[str, Any]) -> None:
    """A request the routing hooks did not name (a partial match, a 405; a router energyprof does not hook):
    Starlette's `scope["route"]`, set once routing is done, holds the route, and its `path` the template.
    A mount there (no endpoint of its own) means no route inside it took the request: unmatched."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str) and hasattr(route, "endpoint"):
        name_request(req, path)
