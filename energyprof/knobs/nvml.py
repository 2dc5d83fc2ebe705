"""The NVIDIA GPU power limit through NVML (mW on the wire, W here). Setting it needs root or a served reader.

The binding is nvml_device.py's, so a binding injected there (tests, a stand-in module) reaches this knob
too; a GPU named explicitly uses the binding even where the driver check fails.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ..collect.sensors.gpu import nvml_device
from .base import Knob, KnobError, KnobRange, Part


class NvmlPowerLimit(Knob):
    kind = "gpu_power_limit"
    unit = "W"

    def __init__(self, index: int | str = 0, binding: Any = None) -> None:
        super().__init__(str(index))
        nv, why = nvml_device.load_binding(binding, explicit=True)
        if nv is None:
            raise KnobError(f"{self.name}: {why}")
        try:
            nv.nvmlInit()
            handle = nv.nvmlDeviceGetHandleByIndex(int(index))
        except Exception as exc:  # noqa: BLE001 - NVMLError, whatever the binding
            raise KnobError(f"{self.name}: {nvml_device.init_note(nv, exc)}") from None
        self._nv = nv
        self._device = nvml_device.NvmlDevice(nv, handle, f"GPU {index}")
        self._range: KnobRange | None = None

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return self._device._call(name, *args)
        except nvml_device.NoPermission:
            raise KnobError(f"{self.name}: no permission to set the GPU power limit (run as root, or through "
                            "`energyprof sensors serve`)") from None
        except nvml_device.NotSupported:
            raise KnobError(f"{self.name}: this GPU does not offer a settable power limit") from None
        except nvml_device.GpuError as exc:
            raise KnobError(f"{self.name}: {exc}") from None

    def read(self) -> float:
        return self._call("nvmlDeviceGetPowerManagementLimit") / 1000.0

    def range(self) -> KnobRange:
        if self._range is None:
            low, high = self._call("nvmlDeviceGetPowerManagementLimitConstraints")
            self._range = KnobRange(low / 1000.0, high / 1000.0)
        return self._range

    def _write(self, value: float) -> None:
        self._call("nvmlDeviceSetPowerManagementLimit", int(round(value * 1000)))

    def parts(self) -> list[Part]:
        return [_LimitPart(self)]

    def energy_j(self) -> float:
        """The GPU's energy counter (J since the driver loaded): the optimizer's window reader."""
        return self._call("nvmlDeviceGetTotalEnergyConsumption") / 1000.0


def binding_ref(nv: Any) -> list[Any] | None:
    """How another process imports the same binding: [module name, folder to put on sys.path or None], or None
    where the binding is an object of this process (a stand-in whose GPU lives and dies with it)."""
    if not isinstance(nv, types.ModuleType) or sys.modules.get(nv.__name__) is not nv:
        return None
    path = getattr(nv, "__file__", None)
    if not path:
        return None
    import os

    root = os.path.dirname(os.path.abspath(path))
    for _ in range(nv.__name__.count(".") + (os.path.basename(path).startswith("__init__.") and 1 or 0)):
        root = os.path.dirname(root)
    return [nv.__name__, root]


class _LimitPart(Part):
    """The limit in mW, as NVML takes it: what is read is written back exactly."""

    def __init__(self, knob: NvmlPowerLimit) -> None:
        self.knob = knob
        self.key = f"nvml:{knob.index}:power_limit"

    def read(self) -> str:
        return str(int(self.knob._call("nvmlDeviceGetPowerManagementLimit")))

    def write(self, value: str) -> None:
        self.knob._call("nvmlDeviceSetPowerManagementLimit", int(value))

    def record(self, value: str) -> dict[str, Any] | None:
        ref = binding_ref(self.knob._nv)
        if ref is None:
            return None
        return {"nvml": int(self.knob.index), "mw": int(value), "binding": ref, "name": self.knob.name}


def restore_limit(index: int, mw: int, ref: list[Any]) -> None:
    """The keeper's process: set GPU `index`'s limit back through the binding named by `ref`."""
    import importlib

    name, root = ref
    if root is not None and root not in sys.path:
        sys.path.insert(0, root)
    nv = importlib.import_module(name)
    nv.nvmlInit()
    nv.nvmlDeviceSetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(int(index)), int(mw))


def discover(binding: Any = None) -> list[NvmlPowerLimit]:
    """Every NVIDIA GPU's power limit, or none where there is no driver or binding (the registry's
    discovery: a machine without NVIDIA GPUs simply has no such knob). The driver check is kept here,
    as for the sensor, so a machine without the driver never pays for importing the binding."""
    nv, _ = nvml_device.load_binding(binding)
    if nv is None:
        return []
    try:
        nv.nvmlInit()
        count = int(nv.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - NVMLError, whatever the binding: no GPU to offer
        return []
    found = []
    for i in range(count):
        try:
            found.append(NvmlPowerLimit(i, nv))
        except KnobError:
            continue
    return found
