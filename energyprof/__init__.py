"""energyprof: which functions spent the energy, and what did it cost in carbon."""

from __future__ import annotations

__version__ = "0.1.0"

from .api import energy_profile  # noqa: E402
from .measurement import Measurement  # noqa: E402
from .monitor import Monitor  # noqa: E402
from .options import OptionError, Options  # noqa: E402
from .profile import Node, Profile, ProfileFormatError, load  # noqa: E402
from .profiler import Profiler  # noqa: E402


def load_ipython_extension(ip: object) -> None:
    """`%load_ext energyprof`: the `%energyprof` / `%%energyprof` magics (IPython is imported only then)."""
    from .integrations.jupyter import load_ipython_extension as load

    load(ip)


__all__ = ["energy_profile", "Profiler", "Measurement", "Monitor", "Profile", "Node", "Options", "OptionError",
           "ProfileFormatError", "load", "__version__"]
