"""Power read through a system-on-chip's own tool: Jetson (tegrastats, jtop), Apple silicon (powermetrics, macmon)."""

from __future__ import annotations

import os
import sys


def on_jetson() -> bool:
    """A Jetson (L4T), told by its release file or SoC family, before any tool's module is imported."""
    if not sys.platform.startswith("linux"):
        return False
    if os.path.exists("/etc/nv_tegra_release"):
        return True
    try:
        with open("/sys/devices/soc0/family", encoding="utf-8") as fh:
            return fh.read().strip().lower().startswith("tegra")
    except OSError:
        return False
