"""The machine's settings that change what a run costs, read once at its start: all read-only.

CPU governor and frequency limits (cpufreq), RAPL power limits (powercap), NVIDIA GPU power limits
and clocks (NVML, if present), the Jetson power mode (`nvpmodel -q`) and `jetson_clocks` state,
and the storage device behind a dataset path. Each reader takes the root it reads under, so tests
point them at fake sysfs trees; what cannot be read is left out, never guessed.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable


COMMAND_TIMEOUT_S = 3.0  # nvpmodel answers in milliseconds; a hung tool must not hold the run's start


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _one_or_all(values: dict[str, Any]) -> Any:
    """One value when every CPU agrees (the usual case), else the value per CPU."""
    distinct = {repr(v) for v in values.values()}
    return next(iter(values.values())) if len(distinct) == 1 else dict(values)


def cpufreq(sys_root: str = "/sys") -> dict[str, Any]:
    """Governor and scaling limits (kHz) across the CPUs that have cpufreq."""
    base = os.path.join(sys_root, "devices/system/cpu")
    cpus = sorted((n for n in _names(base) if n.startswith("cpu") and n[3:4].isdigit()
                   and os.path.isdir(os.path.join(base, n, "cpufreq"))), key=lambda n: int(n[3:]))
    if not cpus:
        return {}
    out: dict[str, Any] = {}
    for key, name, reader in (("governor", "scaling_governor", _read), ("min_khz", "scaling_min_freq", _int),
                              ("max_khz", "scaling_max_freq", _int), ("hardware_max_khz", "cpuinfo_max_freq", _int),
                              ("driver", "scaling_driver", _read), ("epp", "energy_performance_preference", _read)):
        values = {n: reader(os.path.join(base, n, "cpufreq", name)) for n in cpus}
        values = {k: v for k, v in values.items() if v is not None}
        if values:
            out[key] = _one_or_all(values)
    boost = _int(os.path.join(base, "cpufreq/boost"))
    if boost is None:
        no_turbo = _int(os.path.join(base, "intel_pstate/no_turbo"))
        boost = None if no_turbo is None else 1 - no_turbo
    if boost is not None:
        out["boost"] = bool(boost)
    return out


def rapl_limits(powercap_root: str = "/sys/class/powercap") -> dict[str, Any]:
    """Each RAPL zone's power limits in W over their time windows, and whether the zone is enabled."""
    if not os.path.isdir(powercap_root):
        return {}
    out: dict[str, Any] = {}
    for zone_name in sorted(n for n in _names(powercap_root) if n.startswith("intel-rapl:")):
        zone = os.path.join(powercap_root, zone_name)
        name = _read(os.path.join(zone, "name")) or zone_name
        limits: dict[str, Any] = {}
        for k in range(8):
            uw = _int(os.path.join(zone, f"constraint_{k}_power_limit_uw"))
            if uw is None:
                continue
            label = _read(os.path.join(zone, f"constraint_{k}_name")) or f"constraint_{k}"
            window = _int(os.path.join(zone, f"constraint_{k}_time_window_us"))
            limits[label] = {"limit_w": uw / 1e6, **({"window_s": window / 1e6} if window is not None else {})}
        enabled = _int(os.path.join(zone, "enabled"))
        if limits or enabled is not None:
            out[f"{zone_name} ({name})"] = {**limits, **({"enabled": bool(enabled)} if enabled is not None else {})}
    return out


def gpu_limits(binding: Any = None) -> list[dict[str, Any]]:
    """Per NVIDIA GPU: power limit (W, enforced and default), application and maximum clocks (MHz)."""
    from .sensors import presence

    if binding is None and presence.no_nvml() is not None:  # no driver: the device layer is not imported
        return []
    from .sensors.gpu.nvml_device import load_binding

    nv, _why = load_binding(binding)
    if nv is None:
        return []
    try:
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver to ask: no figures
        return []
    out: list[dict[str, Any]] = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            row: dict[str, Any] = {"index": i}
            for key, call in (("name", lambda: _text(nv.nvmlDeviceGetName(h))),
                              ("power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000),
                              ("default_power_limit_w", lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000),
                              ("app_clock_graphics_mhz", lambda: nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_GRAPHICS)),
                              ("app_clock_memory_mhz", lambda: nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_MEM)),
                              ("max_clock_graphics_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_GRAPHICS)),
                              ("persistence", lambda: bool(nv.nvmlDeviceGetPersistenceMode(h)))):
                value = _optional(call)
                if value is not None:
                    row[key] = value
            out.append(row)
    except Exception:  # noqa: BLE001 - what was read is kept
        pass
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:  # noqa: BLE001 - a call the GPU or driver does not support
        return None


def _command(argv: list[str]) -> str | None:
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    import subprocess  # only where the tool is there (a Jetson's nvpmodel): not on every run

    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, encoding="utf-8", errors="replace",
                              timeout=COMMAND_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def jetson() -> dict[str, Any]:
    """`nvpmodel -q` (the power mode's name and number) and `jetson_clocks --show` (its first line),
    where those tools are on PATH. jetson_clocks --show usually needs root: then it is left out."""
    out: dict[str, Any] = {}
    text = _command(["nvpmodel", "-q"])
    if text:
        for line in text.splitlines():
            line = line.strip()
            if line.lower().startswith("nv power mode:"):
                out["power_mode"] = line.split(":", 1)[1].strip()
            elif line.isdigit():
                out["power_mode_id"] = int(line)
    shown = _command(["jetson_clocks", "--show"])
    if shown:
        first = next((ln.strip() for ln in shown.splitlines() if ln.strip()), "")
        if first:
            out["jetson_clocks"] = first
    return out


def storage(path: str, sys_root: str = "/sys") -> dict[str, Any]:
    """The block device behind `path`: its name, the whole disk's model, and its kind (NVMe, SSD, HDD,
    SD/eMMC, USB); a path on a file system with no block device (tmpfs, overlay, NFS) says so."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return {"path": path, "error": exc.strerror or str(exc)}
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    link = os.path.join(sys_root, "dev/block", f"{major}:{minor}")
    if not os.path.exists(link):
        return {"path": path, "device": f"{major}:{minor}", "kind": "no block device (tmpfs, overlay or network)"}
    dev = os.path.realpath(link)
    disk = os.path.dirname(dev) if os.path.exists(os.path.join(dev, "partition")) else dev
    disk_name = os.path.basename(disk)
    out: dict[str, Any] = {"path": path, "device": os.path.basename(dev), "disk": disk_name}
    model = _read(os.path.join(disk, "device/model"))
    if model:
        out["model"] = model
    rotational = _int(os.path.join(disk, "queue/rotational"))
    removable = _int(os.path.join(disk, "removable"))
    resolved = disk
    if disk_name.startswith("mmcblk"):
        kind = "SD card or eMMC"
    elif "/usb" in resolved:
        kind = "USB disk"
    elif disk_name.startswith("nvme"):
        kind = "NVMe SSD"
    elif rotational == 1:
        kind = "HDD"
    elif rotational == 0:
        kind = "SSD"
    else:
        kind = "unknown"
    out["kind"] = kind
    if removable:
        out["removable"] = True
    return out


def read(dataset: str | None = None, sys_root: str = "/sys", powercap_root: str | None = None,
         nvml_binding: Any = None, gpus: bool = True) -> dict[str, Any]:
    """Everything above that this machine has, as one dict for a profile's meta["settings"]."""
    out: dict[str, Any] = {}
    for key, value in (("cpufreq", cpufreq(sys_root)),
                       ("rapl", rapl_limits(powercap_root or os.path.join(sys_root, "class/powercap"))),
                       ("gpus", gpu_limits(nvml_binding) if gpus else []),
                       ("jetson", jetson()),
                       ("storage", storage(dataset, sys_root) if dataset else {})):
        if value:
            out[key] = value
    return out
