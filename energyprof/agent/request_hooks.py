"""The servers and routers that make each web request a window, hooked as they are imported.

Under `python -m energyprof` a program that serves needs no change: when it imports one of the
modules below, the module's functions named here are wrapped once, after its code ran:

    uvicorn.config        Config.load: the loaded ASGI application is served through AsgiRequests
                          (gunicorn's uvicorn workers load theirs the same way)
    hypercorn.app_wrappers  ASGIWrapper: the same, for hypercorn's ASGI applications
    wsgiref.handlers      BaseHandler.setup_environ opens a request, BaseHandler.close ends it
    waitress.task         Task.start opens a WSGI task's request, Task.finish ends it (an error task's
                          start, where the application raised and the channel answers 500 itself)
    gunicorn.http.wsgi    create opens a request (every gunicorn WSGI worker makes its environ there),
                          Response.close ends it
    gunicorn.workers.base Worker.handle_error ends it where the application raised (a 500)
    starlette.routing     Route.matches and Mount.matches: the chosen route names the request
                          (FastAPI's routes are Starlette's); Route.handle: its coroutine's frame is
                          the request's (agent/units.py: which request a sample ran)
    anyio.to_thread       run_sync: a call a request hands to anyio's thread pool (Starlette's and FastAPI's
                          sync handlers, dependencies, response validation) runs as that request's on
                          its worker thread (agent/in_request.py)
    flask.ctx             RequestContext.match_request: the URL rule names the request
    django.core.handlers.base  BaseHandler.resolve_request: the resolver match's route names it
                          (`/items/<int:item_id>`: Django's routes have no leading slash)

Every wrapper is a plain function that takes what the original takes (`*args, **kwargs`, passed on
exactly) and returns what it returns (a coroutine is returned, not awaited); energyprof's own part in
it is guarded (`_ours`): a failure there costs a request its window, never the program its response
or its exceptions, which pass through untouched. None stays on the stack while a request runs and the sampled stacks are the
program's own. The finder that calls `patch` is agent/autoload.py's (this module, and the request's
bookkeeping, load only once the program imports a server or a router).
"""

from __future__ import annotations

import sys

from .in_request import InRequest
from .requests import AsgiRequests, close_request, current, name_request, open_request

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

_DONE = "__energyprof_wrapped__"


def _wrap(cls: Any, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """`cls.attr` (a class's function, or a module's) replaced by `make(original)`, once."""
    original = vars(cls).get(attr)
    if original is None or getattr(original, _DONE, False):
        return
    wrapper = make(original)
    for k in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, k, getattr(original, k))
        except (AttributeError, TypeError):
            pass
    setattr(wrapper, _DONE, True)
    setattr(cls, attr, wrapper)


def _ours(book: Callable[..., None], *args: Any) -> None:
    """energyprof's bookkeeping inside a server's call: a failure of ours (a framework whose names moved,
    a bug) costs the request its window, never the program its response."""
    try:
        book(*args)
    except Exception:  # noqa: BLE001 - only our own bookkeeping is here; the program's calls are outside
        pass


def _after(book: Callable[..., None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`original` called exactly as the server calls it, then `book(self, result)`; its result returned."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            _ours(book, args[0] if args else None, result)
            return result
        return wrapped
    return make


def _uvicorn(module: Any) -> None:
    def book(config: Any, _result: Any) -> None:
        app = getattr(config, "loaded_app", None)
        if app is not None and not isinstance(app, AsgiRequests):
            config.loaded_app = AsgiRequests(app)
    _wrap(module.Config, "load", _after(book))


def _method(environ: Any) -> Any:
    return environ.get("REQUEST_METHOD") if isinstance(environ, dict) else None


def _wsgiref(module: Any) -> None:
    def make_close(close: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            _ours(lambda: close_request(current(), getattr(args[0], "status", None)))
            return close(*args, **kwargs)
        return wrapped
    _wrap(module.BaseHandler, "setup_environ", _after(lambda h, _r: open_request(_method(getattr(h, "environ", None)))))
    _wrap(module.BaseHandler, "close", make_close)


def _ending(kind: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A method after which the request on this thread has ended (for an instance of `kind`), with the
    instance's `status`."""
    def book(self: Any) -> None:
        if isinstance(self, kind):
            close_request(current(), getattr(self, "status", None))

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                _ours(book, args[0] if args else None)
        return wrapped
    return make


def _waitress(module: Any) -> None:
    wsgi_task = module.WSGITask

    def book(task: Any, _result: Any) -> None:
        if isinstance(task, wsgi_task):
            open_request(getattr(getattr(task, "request", None), "command", None))
        else:  # an error task: where the WSGI task before it on this thread raised, the channel answers 500
            close_request(current(), 500)  # with it, never calling that task's finish (a done request: nothing)

    _wrap(module.Task, "start", _after(book))
    _wrap(module.Task, "finish", _ending(wsgi_task))


def _hypercorn(module: Any) -> None:
    _wrap(module.ASGIWrapper, "__init__", _after(lambda wrapper, _none: _wrap_app(wrapper)))


def _wrap_app(wrapper: Any) -> None:
    """An ASGI wrapper's application (`app`) served through AsgiRequests."""
    app = getattr(wrapper, "app", None)
    if app is not None and not isinstance(app, AsgiRequests):
        wrapper.app = AsgiRequests(app)


def _gunicorn(module: Any) -> None:
    def book(_none: Any, result: Any) -> None:
        open_request(_method(result[1]))
    _wrap(module, "create", _after(book))
    _wrap(module.Response, "close", _ending(object))


def _gunicorn_errors(module: Any) -> None:
    """A worker's error path: the application raised, and the worker answers 500 without the response's close."""
    def make(handle_error: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            _ours(lambda: close_request(current(), 500))
            return handle_error(*args, **kwargs)
        return wrapped
    _wrap(module.Worker, "handle_error", make)


def _matches(prefix: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def book(route: Any, result: Any) -> None:
        req = current()
        if req is not None and req.name is None and getattr(result[0], "name", "") == "FULL":
            path = getattr(route, "path", None)
            if isinstance(path, str):
                if prefix:
                    req.prefix += path
                else:
                    name_request(req, path, getattr(route, "endpoint", None))
    return _after(book)


def _handled(_route: Any, coro: Any) -> None:
    """A route's `handle` coroutine: its frame is on the stack wherever the route runs on an event loop (a
    middleware such as Starlette's BaseHTTPMiddleware runs it in a task of its own), so the sampler finds
    the request there."""
    req = current()
    if req is not None:
        req.runs_in(getattr(coro, "cr_frame", None))


def _starlette(module: Any) -> None:
    _wrap(module.Route, "matches", _matches(prefix=False))
    _wrap(module.Mount, "matches", _matches(prefix=True))
    _wrap(module.Route, "handle", _after(_handled))


def _to_thread(module: Any) -> None:
    """anyio's `run_sync(func, *args, ...)`: `func` runs on a worker thread as the request open where it was handed
    over. The wrapper returns `run_sync`'s coroutine, so it is on no stack; on the worker, InRequest's frame is
    passed over as a wrapper's."""
    def make(run_sync: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            req = current()
            if args and req is not None and not req.done:
                try:
                    args = (InRequest(args[0], req.opened), *args[1:])
                except Exception:  # noqa: BLE001 - ours: the call runs as handed over, unattributed
                    pass
            return run_sync(*args, **kwargs)
        return wrapped
    _wrap(module, "run_sync", make)


def _flask(module: Any) -> None:
    def book(ctx: Any, _result: Any) -> None:
        rule = getattr(getattr(ctx, "request", None), "url_rule", None)
        if rule is not None:
            views = getattr(getattr(ctx, "app", None), "view_functions", None) or {}
            name_request(current(), rule.rule, views.get(rule.endpoint))
    _wrap(module.RequestContext, "match_request", _after(book))


def _django(module: Any) -> None:
    def book(_handler: Any, match: Any) -> None:  # Resolver404 where no route took it: the request stays unmatched
        route = getattr(match, "route", None)
        if isinstance(route, str):
            name_request(current(), route if route.startswith("/") else "/" + route, getattr(match, "func", None))
    _wrap(module.BaseHandler, "resolve_request", _after(book))


PATCHES: dict[str, Callable[[Any], None]] = {
    "uvicorn.config": _uvicorn,
    "wsgiref.handlers": _wsgiref,
    "waitress.task": _waitress,
    "hypercorn.app_wrappers": _hypercorn,
    "gunicorn.http.wsgi": _gunicorn,
    "gunicorn.workers.base": _gunicorn_errors,
    "starlette.routing": _starlette,
    "anyio.to_thread": _to_thread,
    "flask.ctx": _flask,
    "django.core.handlers.base": _django,
}


def patch(name: str, module: Any) -> None:
    """Hook `module` (imported as `name`, one of PATCHES); a failure is a note, never the program's."""
    try:
        PATCHES[name](module)
    except Exception as exc:  # noqa: BLE001 - a version whose names moved: it serves, without request windows
        supervised = sys.modules.get("energyprof.agent.supervised")
        agent = supervised.current() if supervised is not None else None
        if agent is not None:
            agent.note(f"web requests through {name} are not windows in this run: {type(exc).__name__}: {exc}")


ROUTERS = ("starlette.routing", "anyio.to_thread", "flask.ctx", "django.core.handlers.base")


def install_routers() -> None:
    """The routers the program has imported, and anyio's thread pool, hooked now (an in-process middleware's
    routes): their requests' windows begin as soon as routing names them, and their sync work on the pool's
    threads is theirs."""
    for name in ROUTERS:
        module = sys.modules.get(name)
        if module is not None:
            patch(name, module)

