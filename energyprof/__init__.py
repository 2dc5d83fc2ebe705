"""energyprof: which functions spent the energy, and what did it cost in carbon.

Importing the package imports nothing: `python -m energyprof` imports it before its
`__main__` can take the current folder off `sys.path`, and a `json.py` or `typing.py` beside
the user's script must not stand in for the standard library's. Each name below is imported
on first use (PEP 562).
"""

_NAMES = {
    "__version__": "._version",
    "energy_profile": ".drive.api",
    "Measurement": ".facts.measurement",
    "Monitor": ".drive.monitor",
    "Options": ".setup.options",
    "OptionError": ".setup.options",
    "Node": ".facts.profile",
    "Profile": ".facts.profile",
    "ProfileFormatError": ".facts.profile",
    "load": ".facts.profile",
    "Profiler": ".drive.profiler",
    "log_metrics": ".integrations.metrics",
    "batch": ".batches",
}

__all__ = ["energy_profile", "Profiler", "Measurement", "Monitor", "Profile", "Node", "Options", "OptionError",
           "ProfileFormatError", "load", "log_metrics", "batch", "__version__"]

# `pytest -p energyprof`: pytest takes the package as a plugin, and loads the plugin module named here.
pytest_plugins = ("energyprof.pytest_plugin",)


def __getattr__(name: str) -> object:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'energyprof' has no attribute {name!r}")
    value = getattr(__import__(module.lstrip("."), globals(), None, [name], 1), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))


def load_ipython_extension(ip: object) -> None:
    """`%load_ext energyprof`: the `%energyprof` / `%%energyprof` magics (IPython is imported only then)."""
    from .integrations.jupyter import load_ipython_extension as load

    load(ip)
