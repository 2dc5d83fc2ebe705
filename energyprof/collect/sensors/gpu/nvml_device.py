"""One thin NVML layer: the binding, nvmlInit's lifetime, and a device whose calls raise mapped errors.

Modelled on Zeus's device layer: every NVML call a sensor makes goes through `NvmlDevice`, which
turns the binding's NVMLError into a `GpuError` subclass with a readable line (pynvml's own
`__str__` calls into the library, so it is guarded). Nothing above this module touches the binding.
The binding is injectable (`BINDING`, or `load_binding(binding)`): tests hand in a fake module with
the same function names, the only thing they fake.
"""

from __future__ import annotations

import threading
from typing import Any

from ..base import SensorError
from ..presence import NVIDIA_DRIVER_MISSING, NVIDIA_DRIVER_PATHS, nvidia_driver

BINDING: Any = None  # a module object with pynvml's names; None: `import pynvml` (nvidia-ml-py)

_NVML_SUCCESS = 0
_MIG_ENABLE = 1
# NVML return codes (nvml.h), used when the binding does not name them.
_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND, _DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _GPU_IS_LOST = 3, 4, 6, 9, 12, 15


class GpuError(SensorError):
    """An NVML call failed; `code` is NVML's return code when known."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NotSupported(GpuError):
    """This GPU or driver does not offer the figure (e.g. no energy counter before Volta)."""


class NoPermission(GpuError):
    pass


class GpuLost(GpuError):
    """The GPU fell off the bus or the driver went away: every later call will fail too."""


def error_text(exc: BaseException) -> str:
    """An NVMLError's text; pynvml's __str__ itself calls into the library, so guard it."""
    try:
        msg = str(exc)
    except Exception:  # noqa: BLE001
        msg = ""
    return msg or f"{type(exc).__name__}({getattr(exc, 'value', '')})"


def mapped(nv: Any, exc: BaseException, what: str) -> GpuError:
    code = getattr(exc, "value", None)
    kind = {getattr(nv, "NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED): NotSupported,
            getattr(nv, "NVML_ERROR_NO_PERMISSION", _NO_PERMISSION): NoPermission,
            getattr(nv, "NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST): GpuLost}.get(code, GpuError)
    return kind(f"{what}: {error_text(exc)}", code if isinstance(code, int) else None)


# Where a loaded NVIDIA kernel driver shows itself on Linux (WSL's GPU device included); a test may point it elsewhere.
DRIVER_PATHS = NVIDIA_DRIVER_PATHS


def load_binding(binding: Any = None, explicit: bool = False) -> tuple[Any, str | None]:
    """The NVML module to use, or None and a line saying why there is none.

    `explicit` (`--sensor nvml`, GPUs named to the optimizer) skips the driver check and tries the
    import anyway: a binding that imports is used even where /proc/driver/nvidia is missing.
    """
    if binding is not None:
        return binding, None
    if BINDING is not None:
        return BINDING, None
    if not explicit and not nvidia_driver(DRIVER_PATHS):
        # No NVIDIA kernel driver (nor WSL's GPU device): importing the binding to be told so cost
        # 10 ms of every run's start on machines without a GPU.
        return None, NVIDIA_DRIVER_MISSING
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None, "NVML: nvidia-ml-py is not installed (pip install 'energyprof[nvidia]'), so no GPU is measured"
    return pynvml, None


def init_note(nv: Any, exc: BaseException) -> str:
    """Why nvmlInit failed, in words a user can act on."""
    code = getattr(exc, "value", None)
    if code == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", _LIBRARY_NOT_FOUND):
        return "NVML: no NVIDIA driver library (libnvidia-ml) on this machine, so no GPU is measured"
    if code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", _DRIVER_NOT_LOADED):
        return "NVML: the NVIDIA driver is not loaded (is there a GPU, and is the kernel module in?), so no GPU is measured"
    if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", _NO_PERMISSION):
        return "NVML: permission denied opening the NVIDIA driver, so no GPU is measured"
    return f"NVML: could not initialise ({error_text(exc)}), so no GPU is measured"


class Session:
    """One nvmlInit shared by every GPU sensor; nvmlShutdown when the last one closes."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.users = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            self.users += 1

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users == 0:
                try:
                    self.nv.nvmlShutdown()
                except Exception:  # noqa: BLE001
                    pass


def _field_value(fv: Any) -> float | None:
    if getattr(fv, "nvmlReturn", _NVML_SUCCESS) != _NVML_SUCCESS:
        return None
    vt = getattr(fv, "valueType", 1)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(vt, "uiVal")
    return float(getattr(fv.value, member))


class NvmlDevice:
    """One GPU as NVML sees it; each method is one NVML call, raising a GpuError subclass on failure."""

    def __init__(self, nv: Any, handle: Any, label: str = "GPU") -> None:
        self.nv = nv
        self.handle = handle
        self.label = label

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.nv, name)(self.handle, *args)
        except Exception as exc:  # noqa: BLE001 - NVMLError and its subclasses, whatever the binding
            raise mapped(self.nv, exc, f"NVML error on {self.label}") from None

    def total_energy_mj(self) -> int:
        """mJ since the driver loaded (Volta and newer), as an exact integer."""
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption"))

    def has_instant_power(self) -> bool:
        return hasattr(self.nv, "NVML_FI_DEV_POWER_INSTANT") and hasattr(self.nv, "nvmlDeviceGetFieldValues")

    def instant_power_mw(self) -> float:
        if not self.has_instant_power():
            raise NotSupported(f"{self.label}: no instant power field in this binding")
        v = _field_value(self._call("nvmlDeviceGetFieldValues", [self.nv.NVML_FI_DEV_POWER_INSTANT])[0])
        if v is None:
            raise NotSupported(f"{self.label}: the instant power field does not answer")
        return v

    def average_power_mw(self) -> float:
        """nvmlDeviceGetPowerUsage: a 1 s moving average on Ampere and newer."""
        return float(self._call("nvmlDeviceGetPowerUsage"))

    def utilization_gpu(self) -> float:
        """The share of the last sample period in which a kernel ran, in percent (nvmlDeviceGetUtilizationRates)."""
        return float(self._call("nvmlDeviceGetUtilizationRates").gpu)

    def compute_pids(self) -> set[int]:
        return {int(p.pid) for p in self._call("nvmlDeviceGetComputeRunningProcesses")}

    def process_utilization(self, since: int) -> list[tuple[int, float, int]]:
        """(pid, SM utilisation, timestamp) per process sample since `since`; NotSupported if absent."""
        if not hasattr(self.nv, "nvmlDeviceGetProcessUtilization"):
            raise NotSupported(f"{self.label}: no per-process utilisation in this binding")
        return [(int(s.pid), float(getattr(s, "smUtil", 0) or 0), int(getattr(s, "timeStamp", 0) or 0))
                for s in self._call("nvmlDeviceGetProcessUtilization", since)]

    def mig_enabled(self) -> bool:
        return self._call("nvmlDeviceGetMigMode")[0] == _MIG_ENABLE

    def power_limit_w(self) -> float:
        return self._call("nvmlDeviceGetEnforcedPowerLimit") / 1000.0
