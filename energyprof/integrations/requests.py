"""The in-process request middlewares: each request a window of the profile that runs
(`energy_profile()`, `Profiler`), named by method and route template (agent/requests.py).

Here, not in `agent/`, because the WSGI middleware's call stays on the stack while the application
runs: the sampler passes over this folder's frames (they are wrappers), so the stacks read as the
program's own.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from ..agent.request_hooks import install_routers
from ..agent.requests import AsgiRequests, Request, close_request, open_request, served, status_code


class AsgiMiddleware(AsgiRequests):
    """`app = EnergyMiddleware(app)` or `app.add_middleware(EnergyMiddleware)`: each HTTP request is a
    window. The routers already imported (Starlette, FastAPI, Flask) are hooked, so a window begins as
    soon as routing names it."""

    __slots__ = ()
    MIDDLEWARE = True

    def __init__(self, app: Callable[..., Any]) -> None:
        super().__init__(app)
        install_routers()


class WsgiMiddleware:
    """`app.wsgi_app = EnergyMiddleware(app.wsgi_app)`: each request is a window, from the call until the
    server closes the response."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        install_routers()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        req = None if served() else open_request(environ.get("REQUEST_METHOD"), by_middleware=True)
        if req is None:  # nothing profiled, or the server's hook has the request already
            return self.app(environ, start_response)

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            req.status = status_code(status)
            return start_response(status, headers) if exc_info is None else start_response(status, headers, exc_info)

        try:
            result = self.app(environ, start)
        except BaseException:
            close_request(req, 500)
            raise
        wrapper = environ.get("wsgi.file_wrapper")
        if isinstance(wrapper, type) and isinstance(result, wrapper):
            # the server sends the file itself (sendfile) only when it gets its own wrapper back: the
            # request's work is done, and the response goes as it is
            close_request(req)
            return result
        return _SizedBody(result, req) if hasattr(result, "__len__") else _Body(result, req)


class _Body:
    """The response, handed on as it is; its `close` (which the server calls) ends the request."""

    __slots__ = ("result", "req")

    def __init__(self, result: Iterable[bytes], req: Request) -> None:
        self.result, self.req = result, req

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.result)

    def close(self) -> None:
        try:
            close = getattr(self.result, "close", None)
            if close is not None:
                close()
        finally:
            close_request(self.req)


class _SizedBody(_Body):
    """A response whose length the server may ask (waitress: one item means its Content-Length); only
    where the application's has one, so a streamed response stays one of unknown length."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(self.result)  # type: ignore[arg-type]
