"""What a supervised program gets without asking: the pytest plugin, a batched `generate`'s rows, and a
window per web request.

Under `python -m energyprof`, a process that runs pytest gets energyprof's pytest plugin (each test
a window, budgets checked), and a process that uses Hugging Face transformers gets its batched
`generate` split per row (energyprof/batches.py). Nothing of either is imported to find out: a
finder on `sys.meta_path` waits for the module in question to be imported by the program, lets it
load as it would, and then:
- `_pytest.config`: its `get_config` asks the new config's plugin manager to import
  `energyprof.pytest_plugin`, exactly as `-p energyprof.pytest_plugin` would (so `-p no:...`
  still turns it off). Neither the program's argv nor its environment changes, so a pytest in
  another environment that the program starts never hears of it.
- `transformers.generation.utils`: `energyprof.batches.hook_generate` wraps its `generate`.
- a web server's or router's module (REQUEST_MODULES): agent/request_hooks.py hooks it, so each
  request is a window named by its route.
Where energyprof itself cannot be imported (a program in another environment with the same
Python), nothing happens. The agent imports nothing of energyprof's: the plugin is imported by
pytest, the hook by name, only in a program that has just imported what they serve.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

PYTEST_PLUGIN = "energyprof.pytest_plugin"
GENERATE_HOOK = ("energyprof.batches", "hook_generate")


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
    try:
        hook = getattr(__import__(GENERATE_HOOK[0], fromlist=[GENERATE_HOOK[1]]), GENERATE_HOOK[1])
    except Exception:  # noqa: BLE001 - energyprof is not importable here: generate runs as it is
        return
    hook(module)


# The web servers and routers that make each request a window (agent/request_hooks.py, imported only
# once the program imports one of them: a program that serves nothing loads none of it).
REQUEST_MODULES = ("uvicorn.config", "hypercorn.app_wrappers", "wsgiref.handlers", "waitress.task",
                   "gunicorn.http.wsgi", "gunicorn.workers.base", "starlette.routing", "flask.ctx",
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


class _Then:
    """A module's own loader, with `after` run once the module has loaded (its failure is ignored)."""

    def __init__(self, loader: Any, after: Callable[[Any], None]) -> None:
        self._loader, self._after = loader, after

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            self._after(module)
        except Exception:  # noqa: BLE001 - the program's import succeeded; energyprof's addition is optional
            pass

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package...: the loader's own
        return getattr(self._loader, name)


class _Finder:
    """Finds nothing itself: for a watched module, the spec the path finder gives, its loader wrapped."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        after = _AFTER.pop(name, None)
        if after is None:
            return None
        if not _AFTER and self in sys.meta_path:  # nothing left to watch: the import system as it was
            sys.meta_path.remove(self)
        spec = sys.modules["_frozen_importlib_external"].PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Then(spec.loader, after)
        return spec


_installed = False


def install() -> None:
    """Watch for the modules above (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in [n for n in _AFTER if n in sys.modules]:
        _AFTER.pop(name)(sys.modules[name])  # already loaded (a fork of a process that had it): now
    sys.meta_path.insert(0, _Finder())
