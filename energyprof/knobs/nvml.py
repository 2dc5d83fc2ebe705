"""The NVIDIA GPU power limit through NVML (mW on the wire, W here). Setting it needs root or a served reader.

The binding is nvml_device.py's, so a binding injected there (tests, a stand-in module) reaches this knob
too; a GPU named explicitly uses the binding even where the driver check fails.
"""

from __future__ import annotations

from typing import Any

from ..collect.sensors.gpu import nvml_device
from .base import Knob, KnobError, KnobRange


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

    def energy_j(self) -> float:
        """The GPU's energy counter (J since the driver loaded): the optimizer's window reader."""
        return self._call("nvmlDeviceGetTotalEnergyConsumption") / 1000.0


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
