"""What a supervised program gets without asking: the pytest plugin, a batched `generate`'s rows, and a
window per web request.

Under `python -m energyprof`, a process that runs pytest gets energyprof's pytest plugin (each test
a window, budgets checked), and a process that uses Hugging Face transformers gets its batched
`generate` split per row (agent/generate.py), and a process that serves web requests a window per
request. Nothing of these is imported to find out: a finder on `sys.meta_path` waits for the module
in question to be imported by the program, lets it load as it would (the spec the path finder gives,
the module's `__loader__` its own loader), and then:
- `_pytest.config`: its `get_config` asks the new config's plugin manager to load
  `energyprof.pytest_plugin`, exactly as `-p energyprof.pytest_plugin` would (pytest imports it, so
  `-p no:...` still turns it off). Neither the program's argv nor its environment changes, so a
  pytest in another environment that the program starts never hears of it.
- `transformers.generation.utils`: agent/generate.py wraps its `generate`.
- a web server's or router's module (REQUEST_MODULES): agent/request_hooks.py hooks it, so each
  request is a window named by its route.
Each addition is a sibling module, imported once its target has loaded: the agent imports nothing
above it. The finder leaves `sys.meta_path` once every watched module has loaded; until then it is
its first entry (docs/testing.md). Asking where a module is (`importlib.util.find_spec`) without
importing it uses up nothing: the addition runs when the module is executed.
"""

from __future__ import annotations

import sys

# Annotations only: the program's imports are its own, so the agent adds no `typing` to them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

PYTEST_PLUGIN = "energyprof.pytest_plugin"


def _pytest_config(module: Any) -> None:
    original = module.get_config

    def get_config(*args: Any, **kwargs: Any) -> Any:
        config = original(*args, **kwargs)
        try:
            config.pluginmanager.import_plugin(PYTEST_PLUGIN)
        except Exception:  # noqa: BLE001 - pytest runs as it would without energyprof's plugin
            pass
        return config

    get_config.__wrapped__ = original  # type: ignore[attr-defined]
    get_config.__doc__, get_config.__name__, get_config.__qualname__ = (
        original.__doc__, original.__name__, original.__qualname__)
    module.get_config = get_config


def _generation_utils(module: Any) -> None:
    from .generate import hook_generate

    hook_generate(module)


# The web servers and routers that make each request a window, and anyio's thread pool that runs a request's
# sync work (agent/request_hooks.py, imported only once the program imports one of them: a program that serves
# nothing and uses no anyio loads none of it).
REQUEST_MODULES = ("uvicorn.config", "hypercorn.app_wrappers", "wsgiref.handlers", "waitress.task",
                   "gunicorn.http.wsgi", "gunicorn.workers.base", "starlette.routing", "anyio.to_thread", "flask.ctx",
                   "django.core.handlers.base")


def _requests(name: str) -> Callable[[Any], None]:
    def after(module: Any) -> None:
        from .request_hooks import patch

        patch(name, module)
    return after


_AFTER: dict[str, Callable[[Any], None]] = {
    "_pytest.config": _pytest_config,
    "transformers.generation.utils": _generation_utils,
    **{name: _requests(name) for name in REQUEST_MODULES},
}


def _done(name: str) -> Callable[[Any], None] | None:
    """The addition for `name`, once; the finder leaves the import system when none is left."""
    after = _AFTER.pop(name, None)
    if not _AFTER:
        for finder in [f for f in sys.meta_path if isinstance(f, _Finder)]:
            sys.meta_path.remove(finder)
    return after


class _Then:
    """A module's own loader, with the addition run once the module has executed (its failure is ignored).
    The module keeps its own loader as `__loader__` and in its spec."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._loader.exec_module(module)
        after = _done(self._name)
        if after is None:
            return
        try:
            after(module)
        except Exception:  # noqa: BLE001 - the program's import succeeded; energyprof's addition is optional
            pass

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package...: the loader's own
        return getattr(self._loader, name)


class _Finder:
    """Finds nothing itself: for a watched module, the spec the path finder gives, its loader wrapped."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _AFTER:
            return None
        spec = sys.modules["_frozen_importlib_external"].PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Then(spec.loader, name)
        return spec


_installed = False


def install() -> None:
    """Watch for the modules above (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in [n for n in _AFTER if n in sys.modules]:
        after = _done(name)  # already loaded (a fork of a process that had it): now
        if after is not None:
            try:
                after(sys.modules[name])
            except Exception:  # noqa: BLE001 - as above
                pass
    if _AFTER:
        sys.meta_path.insert(0, _Finder())
