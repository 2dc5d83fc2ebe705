"""energyprof: which functions spent the energy, and what did it cost in carbon."""

from __future__ import annotations

from ._version import __version__
from .api import energy_profile
from .measurement import Measurement
from .monitor import Monitor
from .options import OptionError, Options
from .profile import Node, Profile, ProfileFormatError, load
from .profiler import Profiler


def load_ipython_extension(ip: object) -> None:
    """`%load_ext energyprof`: the `%energyprof` / `%%energyprof` magics (IPython is imported only then)."""
    from .integrations.jupyter import load_ipython_extension as load

    load(ip)


__all__ = ["energy_profile", "Profiler", "Measurement", "Monitor", "Profile", "Node", "Options", "OptionError",
           "ProfileFormatError", "load", "__version__"]
