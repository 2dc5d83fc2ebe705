"""energyprof: which functions spent the energy, and what did it cost in carbon."""

from __future__ import annotations

__version__ = "0.1.0"

from .api import energy_profile  # noqa: E402
from .options import OptionError, Options  # noqa: E402
from .profile import Node, Profile, ProfileFormatError, load  # noqa: E402
from .profiler import Profiler  # noqa: E402

__all__ = ["energy_profile", "Profiler", "Profile", "Node", "Options", "OptionError", "ProfileFormatError",
           "load", "__version__"]
