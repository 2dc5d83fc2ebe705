"""energyprof's bootstrap: starts the stack sampler in every Python process of a profiled run.

The supervisor puts this folder first on PYTHONPATH and names its spool in
ENERGYPROF_AGENT, as coverage.py measures subprocesses. Python imports this module while
it starts, before `sys.path[0]` (the script's folder) exists, so the sampler module is
loaded by path from the standard library alone; then this folder leaves `sys.path` (nothing
is importable from it afterwards) and any other `sitecustomize` runs as it would have.
"""


def _start() -> None:
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        while here in sys.path:
            sys.path.remove(here)
        raw = os.environ.get("ENERGYPROF_AGENT")
        if raw:
            config = dict(item.split("=", 1) for item in raw.split("\x1f") if "=" in item)
            name = "energyprof.agent.sampler"
            module = sys.modules.get(name)
            if module is None:
                import importlib.util

                path = os.path.join(os.path.dirname(here), "sampler.py")
                spec = importlib.util.spec_from_file_location(name, path)
                if spec is not None and spec.loader is not None:
                    module = importlib.util.module_from_spec(spec)
                    sys.modules[name] = module
                    spec.loader.exec_module(module)
            if module is not None:
                module.start_agent(config)
    except Exception as exc:  # noqa: BLE001 - never stop the program from starting
        sys.stderr.write(f"energyprof: could not start sampling this process: {exc}\n")
    # Chain to the sitecustomize this one hides, if any.
    me = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if me is not None:
            sys.modules["sitecustomize"] = me


_start()
