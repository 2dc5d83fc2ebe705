"""AMD GPU power cap through the amdsmi binding (`amdsmi_get_power_cap_info`, `amdsmi_set_power_cap`).

amdsmi speaks microwatts; the knob speaks watts. The binding is passed in (the sensor's own
discovery does the same), so a stand-in binding reaches the knob without a GPU.
"""

from __future__ import annotations

from typing import Any


from .base import Knob, KnobError, KnobPart, KnobRange, Part


def _binding() -> Any:
    try:
        import amdsmi  # type: ignore[import-not-found]
    except ImportError:
        return None
    return amdsmi


def _info(lib: Any, handle: Any, name: str) -> dict[str, Any]:
    try:
        return dict(lib.amdsmi_get_power_cap_info(handle))
    except Exception as exc:  # the binding raises its own AmdSmiLibraryException
        raise KnobError(f"{name}: amdsmi cannot read the power cap: {exc}") from None


class AmdPowerCap(Knob):
    kind = "gpu_power_limit"
    unit = "W"

    def __init__(self, lib: Any, handle: Any, index: str) -> None:
        super().__init__(index)
        self.lib = lib
        self.handle = handle

    def read(self) -> float:
        return float(_info(self.lib, self.handle, self.name)["power_cap"]) / 1e6

    def range(self) -> KnobRange:
        info = _info(self.lib, self.handle, self.name)
        return KnobRange(float(info["min_power_cap"]) / 1e6, float(info["max_power_cap"]) / 1e6)

    def parts(self) -> list[Part]:
        return [_CapPart(self)]

    def _write(self, value: float) -> None:
        try:
            self.lib.amdsmi_set_power_cap(self.handle, 0, int(round(value * 1e6)))
        except Exception as exc:
            raise KnobError(f"{self.name}: amdsmi cannot set the power cap to {value:g} W: {exc}"
                            " (root, or energyprof sensors serve, can)") from None


class _CapPart(KnobPart):
    def __init__(self, knob: AmdPowerCap) -> None:
        super().__init__(knob, f"amdsmi:{knob.index}:power_cap")

    def record(self, value: str) -> dict[str, Any] | None:
        # Another process finds the GPU again through `import amdsmi`: only when that is the binding used here
        # (a stand-in object's state lives and dies with this process).
        if getattr(self.knob.lib, "__name__", None) != "amdsmi":
            return None
        return {"name": self.knob.name, "value": float(value)}


def discover(lib: Any = None) -> list[Knob]:
    """One knob per AMD GPU, indexed in amdsmi's order; none without the binding or a GPU."""
    lib = lib if lib is not None else _binding()
    if lib is None:
        return []
    try:
        lib.amdsmi_init()
        handles = list(lib.amdsmi_get_processor_handles())
    except Exception:
        return []
    return [AmdPowerCap(lib, h, str(i)) for i, h in enumerate(handles)]
