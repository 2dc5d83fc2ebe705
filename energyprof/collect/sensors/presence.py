"""Whether each backend's hardware or tool is there at all, told without importing the backend.

Every run's discovery looks for RAPL, the privileged reader, the `power` perf events, NVIDIA's and
AMD's GPUs and, on a Jetson or a Mac, their tools (`energyprof sensors` for all of them anywhere);
most machines have few of them. A backend's module (its sensor classes, ctypes structures, NVML's
numbering and sharing, a tool's parser) is imported only once the cheap check here (a path exists,
a tool is on PATH, a binding is importable) says there is something to read. Each check is the one
its backend makes first, with its words for what is missing: the backend's own `discover` asks this
module too, so both say the same thing.
"""

from __future__ import annotations

import os
import sys

from .base import Discovery

POWERCAP_ROOT = "/sys/class/powercap"
PERF_ROOT = "/sys/bus/event_source/devices/power"
SOCKET = "/run/energyprof/rapl.sock"
#: Where a loaded NVIDIA kernel driver shows itself on Linux (WSL's GPU device included).
NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/dxg")
NVIDIA_DRIVER_MISSING = "NVML: the NVIDIA driver is not loaded (no /proc/driver/nvidia), so no GPU is measured"
SERVED_ENABLE = ("start the privileged reader: its systemd socket unit (energyprof sensors unit; docs/sensors.md), "
                 "or sudo energyprof sensors serve --group energyprof, then add users to that group")
#: The step that enables amdsmi.
AMDSMI_INSTALL = ("install ROCm's Python binding (pip install amdsmi, matching the installed ROCm) on a machine "
                  "with an AMD GPU")
#: The step that gives each system-on-chip tool, where it is not on PATH (jtop: where its binding is missing).
TOOL_STEPS = {
    "tegrastats": ("tegrastats ships with every Jetson's L4T (/usr/bin/tegrastats); on other machines there is no "
                   "Jetson power to read"),
    "jtop": "pip install jetson-stats (on the Jetson, as root) and start its service: sudo systemctl enable --now jtop.service",
    "powermetrics": "powermetrics ships with macOS (/usr/bin/powermetrics); not on this machine",
    "macmon": "install macmon (`brew install macmon`): it reads Apple silicon's power without sudo",
}

_PACKAGE = __name__.rpartition(".")[0]


def powercap_root(explicit: str | None = None) -> str:
    return explicit or os.environ.get("ENERGYPROF_POWERCAP_ROOT") or POWERCAP_ROOT


def perf_root(explicit: str | None = None) -> str:
    return explicit or os.environ.get("ENERGYPROF_PERF_ROOT") or PERF_ROOT


def socket_path(explicit: str | None = None) -> str:
    return explicit or os.environ.get("ENERGYPROF_SENSOR_SOCKET") or SOCKET


def loaded(module: str) -> bool:
    """Whether a backend's module is imported already: then importing it costs nothing, and whatever
    was injected into it (a fake binding, other driver paths) must be what decides."""
    return f"{_PACKAGE}.{module}" in sys.modules


def no_rapl(root: str | None = None) -> Discovery | None:
    """What RAPL finds where there is no powercap tree; None where there is one to read."""
    base = powercap_root(root)
    if os.path.isdir(base):
        return None
    found = Discovery()
    found.notes.append(f"RAPL: {base} does not exist (no powercap driver, not Linux, or not mounted)")
    return found


def no_served(path: str | None = None, explicit: bool = False) -> Discovery | None:
    """What the privileged reader's client finds where no reader listens; None where its socket is there."""
    where = socket_path(path)
    if os.path.exists(where):
        return None
    found = Discovery()
    if explicit:
        found.notes.append(f"served RAPL: no reader at {where}. {SERVED_ENABLE}")
    return found


def no_perf(root: str | None = None, explicit: bool = False) -> Discovery | None:
    """What the perf backend finds without a `power` PMU; None where one describes its events."""
    base = perf_root(root)
    if os.path.isdir(os.path.join(base, "events")):
        return None
    return Discovery.absent("perf", f"{base} has no events",
                            "no `power` perf PMU (not an Intel/AMD CPU with RAPL, a VM, or not Linux)", explicit)


def nvidia_driver(paths: tuple[str, ...] = NVIDIA_DRIVER_PATHS) -> bool:
    """Whether NVIDIA's kernel driver may be there: off Linux, the binding alone can tell."""
    return not sys.platform.startswith("linux") or any(os.path.exists(p) for p in paths)


def no_nvml(explicit: bool = False) -> Discovery | None:
    """What NVML finds without the driver (as gpu/nvml_device.load_binding says it); None where the
    binding must be asked: a driver is there, NVML was named, or its device module is loaded."""
    if explicit or loaded("gpu.nvml_device") or nvidia_driver():
        return None
    found = Discovery()
    found.notes.append(NVIDIA_DRIVER_MISSING)
    return found


def no_amdsmi(explicit: bool = False) -> Discovery | None:
    """What amdsmi finds without ROCm's binding installed (nor a fake one injected into its module)."""
    import importlib.util

    if loaded("gpu.amdsmi") or importlib.util.find_spec("amdsmi") is not None:
        return None
    return amdsmi_absent(explicit)


def amdsmi_absent(explicit: bool = False) -> Discovery:
    return Discovery.absent("amdsmi", "the binding is not installed", AMDSMI_INSTALL, explicit)


def no_tool(name: str, explicit: bool = False) -> Discovery | None:
    """What a system-on-chip tool's backend finds where the tool is not on PATH; None where it is."""
    import shutil

    return None if shutil.which(name) is not None else tool_absent(name, explicit)


def tool_absent(name: str, explicit: bool = False) -> Discovery:
    return Discovery.absent(name, "not found on PATH", TOOL_STEPS[name], explicit)


def no_jtop(explicit: bool = False) -> Discovery | None:
    """What jtop finds without jetson-stats installed (nor a fake one injected into its module)."""
    import importlib.util

    if loaded("soc.jtop") or importlib.util.find_spec("jtop") is not None:
        return None
    return jtop_absent(explicit)


def jtop_absent(explicit: bool = False) -> Discovery:
    return Discovery.absent("jtop", "jetson-stats is not installed", TOOL_STEPS["jtop"], explicit)


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
