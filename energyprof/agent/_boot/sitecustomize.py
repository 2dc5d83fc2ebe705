"""energyprof's bootstrap: starts the stack sampler in every Python process of a profiled run.

The supervisor puts this folder first on PYTHONPATH and names its spool in
ENERGYPROF_AGENT, as coverage.py measures subprocesses. Python imports this module while
it starts, before `sys.path[0]` (the script's folder) exists, so the agent package is
loaded by path from the standard library alone; then this folder leaves `sys.path`.

Every Python on PATH reads this file, 2.7 included: it is written in the syntax they all
parse, and it does nothing (silently) in any interpreter but the supervisor's version, in a
run that has ended, or wherever the agent cannot serve. A sitecustomize of the user's that
this one hides runs next, once; when there is none, `import sitecustomize` fails later as it
would without energyprof (the module leaves `sys.modules` by failing its import quietly).
"""
import os
import sys


def _agent_config():
    raw = os.environ.get("ENERGYPROF_AGENT")
    if not raw:
        return None
    config = dict(item.split("=", 1) for item in raw.split("\x1f") if "=" in item)
    if config.get("python") != "%d.%d" % sys.version_info[:2]:
        return None
    spool = config.get("spool", "")
    if not (os.path.isabs(spool) and os.path.isdir(spool)):
        return None  # the run has ended (a daemon's late child): load nothing (the agent checks the rest)
    return config


def _start(here):
    config = _agent_config()
    if config is None:
        return
    # The import system's own modules, loaded in every interpreter: `importlib.util` (and the
    # `importlib` package) would bring contextlib, functools, collections and warnings into a
    # program that may never import them, 3 ms of every Python process's start.
    bootstrap = sys.modules["_frozen_importlib"]
    if sys.modules.get("energyprof.agent") is None:
        init = os.path.join(os.path.dirname(here), "__init__.py")
        spec = sys.modules["_frozen_importlib_external"].spec_from_file_location(
            "energyprof.agent", init, submodule_search_locations=[os.path.dirname(here)])
        agent = bootstrap.module_from_spec(spec)
        sys.modules["energyprof.agent"] = agent
        spec.loader.exec_module(agent)
    # what importlib.import_module calls: never `__import__`, which would import energyprof's top package
    bootstrap._gcd_import("energyprof.agent.supervised").start_agent(config)


def _boot():
    here = os.path.dirname(os.path.abspath(__file__))
    while here in sys.path:
        sys.path.remove(here)
    try:
        _start(here)
    except Exception as exc:  # noqa: BLE001 - never stop the program from starting
        sys.stderr.write("energyprof: could not start sampling this process: %s\n" % (exc,))
    # The sitecustomize this one hides, if any, runs now (this folder is off sys.path).
    me = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401
    except ImportError as exc:
        if getattr(exc, "name", "sitecustomize") != "sitecustomize":
            raise
        if me is not None:
            sys.modules["sitecustomize"] = me  # the import in progress expects it


_boot()
if sys.modules.get("sitecustomize") is not None and sys.modules["sitecustomize"].__name__ == __name__ and \
        getattr(sys.modules["sitecustomize"], "_boot", None) is _boot:
    # No sitecustomize of the user's: leave as if there were none (site.py ignores this error).
    error = ImportError("No module named 'sitecustomize'")
    error.name = "sitecustomize"
    raise error
