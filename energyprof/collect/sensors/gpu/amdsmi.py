"""AMD GPUs through the amdsmi Python binding (ROCm): the energy counter where it can be trusted,
else socket power polled and integrated.

Per GPU, best first:
1. `amdsmi_get_energy_count`: `energy_accumulator` (older bindings: `power`) x
   `counter_resolution` (15.3) microjoules. The counter is checked against the power reading at
   start (as Zeus does): on some boards it freezes until a reboot, runs backward, or
   under-reports about 15x; then it is not used, and a note says so.
2. `amdsmi_get_power_info`: `current_socket_power` (instantaneous; MI300), else
   `average_socket_power` (MI200), in watts; either may be "N/A". Integrated by trapezoids.
Sources are `gpu:N`, N the index HIP gives the GPU (PCI bus order, then HIP_VISIBLE_DEVICES /
ROCR_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES), so the supervisor ties each to its rank as it
ties NVML's GPUs (numbering.py does the ordering for both).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from ..base import Discovery, Sensor, SensorError, WrapCounter
from ..presence import AMDSMI_INSTALL, amdsmi_absent
from .numbering import GpuInfo, parse_bus_id, text, visible_order
from .nvml import _optional
from .nvml_device import GpuError, NotSupported
from .share import ProcessShare

BINDING: Any = None  # a module with amdsmi's names (tests inject a fake); None: `import amdsmi`
CHECK_S = 0.5  # how long the counter is watched against power at start (Zeus uses 0.5 s)
POWER_PERIOD_S = 0.001 * 50  # AMD SMU refreshes socket power about every 50 ms (estimated, not measured here)
COUNTER_PERIOD_S = 0.001  # the energy accumulator is updated every ~1 ms (amdsmi docs: "over 1ns" resolution)
UNDER_REPORT = 0.25  # a counter below a quarter of what power says over the check is not trusted
INSTALL = AMDSMI_INSTALL
VISIBLE_ENV = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def counter_uj(raw: Mapping[str, Any]) -> float:
    """Microjoules from one `amdsmi_get_energy_count` dict."""
    acc = raw.get("energy_accumulator", raw.get("power"))
    return float(acc) * float(raw["counter_resolution"])


def power_w(info: Mapping[str, Any]) -> tuple[float | None, str]:
    """(watts, which key) from `amdsmi_get_power_info`; instantaneous first, "N/A" skipped."""
    for key in ("current_socket_power", "average_socket_power"):
        v = info.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v), key
        try:
            return float(str(v).split()[0]), key
        except (ValueError, IndexError):
            continue
    return None, ""


class AmdGpu:
    """One GPU's readings, each raising SensorError on failure, and its process list in the shape
    share.ProcessShare asks NVML's for (GpuError when the binding cannot list processes)."""

    def __init__(self, smi: Any, handle: Any) -> None:
        self.smi, self.handle = smi, handle

    def compute_pids(self) -> set[int]:
        try:
            listed = self.smi.amdsmi_get_gpu_process_list(self.handle)
            # newer bindings list dicts; older ones list process handles to look up
            return {int(p["pid"] if isinstance(p, dict) else self.smi.amdsmi_get_gpu_process_info(self.handle, p)["pid"])
                    for p in listed}
        except Exception as exc:  # noqa: BLE001 - not supported, no permission
            raise GpuError(f"amdsmi process list: {exc}") from None

    def process_utilization(self, since: int) -> list[tuple[int, float, int]]:
        raise NotSupported("amdsmi reports no per-process utilisation")

    def energy_uj(self) -> float:
        try:
            return counter_uj(self.smi.amdsmi_get_energy_count(self.handle))
        except Exception as exc:  # noqa: BLE001 - AmdSmiLibraryException, KeyError: no counter
            raise SensorError(f"amdsmi energy counter: {exc}") from None

    def power(self) -> tuple[float | None, str]:
        try:
            return power_w(self.smi.amdsmi_get_power_info(self.handle))
        except Exception as exc:  # noqa: BLE001
            raise SensorError(f"amdsmi power: {exc}") from None


def check_counters(gpus: list[AmdGpu], check_s: float = CHECK_S,
                   sleep: Callable[[float], None] = time.sleep) -> list[tuple[bool, str]]:
    """(trust the counter, why not) per GPU: each counter watched against power for `check_s`,
    all GPUs over the same wait."""
    first: list[tuple[float | None, float | None, str]] = []
    for gpu in gpus:
        try:
            first.append((gpu.energy_uj(), _power_or_none(gpu), ""))
        except SensorError as exc:
            first.append((None, None, f"no energy counter ({exc})"))
    t0 = time.perf_counter()
    if any(e is not None for e, _, _ in first):
        sleep(check_s)
    dt = time.perf_counter() - t0
    out = []
    for gpu, (e0, p0, why) in zip(gpus, first):
        if e0 is None:
            out.append((False, why))
            continue
        try:
            e1 = gpu.energy_uj()
        except SensorError as exc:
            out.append((False, str(exc)))
            continue
        out.append(judge(e0, e1, [p for p in (p0, _power_or_none(gpu)) if p is not None], dt))
    return out


def judge(e0: float, e1: float, powers: list[float], dt: float) -> tuple[bool, str]:
    """Whether a counter that went from e0 to e1 uJ in dt s agrees with the power readings."""
    if e1 < e0:
        return False, f"the energy counter ran backward ({e0:.0f} -> {e1:.0f} uJ)"
    if not powers:
        return True, ""
    expected_j = sum(powers) / len(powers) * dt
    got_j = (e1 - e0) / 1e6
    if got_j == 0 and expected_j > 0:
        return False, f"the energy counter did not move in {dt:.2f} s while the GPU drew {powers[-1]:g} W (frozen)"
    if got_j < UNDER_REPORT * expected_j:
        return False, (f"the energy counter rose {got_j:.3g} J in {dt:.2f} s where power says about {expected_j:.3g} J "
                       "(under-reporting)")
    return True, ""


def _power_or_none(gpu: AmdGpu) -> float | None:
    try:
        return gpu.power()[0]
    except SensorError:
        return None


class HipShare(ProcessShare):
    """This process's share of an AMD GPU: NVML's rules over amdsmi's process list; "uses the GPU"
    means HIP is loaded (torch's ROCm build also answers torch.cuda)."""

    def uses_cuda(self) -> bool:
        if not self._uses_cuda:
            try:
                with open("/proc/self/maps", "rb") as fh:
                    self._uses_cuda = b"libamdhip64" in fh.read()
            except OSError:
                pass
        return self._uses_cuda or super().uses_cuda()


class AmdSmiSensor(Sensor):
    per_process_share = True

    def __init__(self, source_id: str, gpu: AmdGpu, kind: str, detail: dict[str, Any]) -> None:
        super().__init__(id=source_id, component=source_id, method="measured", sensor="amdsmi", detail=detail,
                         update_period_s=COUNTER_PERIOD_S if kind == "counter" else POWER_PERIOD_S,
                         tier="counter" if kind == "counter" else "integrated")
        self.gpu = gpu
        self.kind = kind
        self.share = HipShare(gpu)  # type: ignore[arg-type]
        self._counter: WrapCounter | None = None
        self._joules = 0.0
        self._last: tuple[int, float] | None = None

    def _watts(self) -> float:
        w, _ = self.gpu.power()
        if w is None:
            raise SensorError("amdsmi: socket power is N/A")
        return w

    def start(self, t_ns: int) -> None:
        if self.kind == "counter":
            self._counter = WrapCounter(self.gpu.energy_uj(), None)
        else:
            self._joules, self._last = 0.0, (t_ns, self._watts())

    def read(self, t_ns: int) -> float:
        if self.kind == "counter":
            raw = self.gpu.energy_uj()
            if self._counter is None:
                self._counter = WrapCounter(raw, None)
            if raw < self._counter.last:
                raise SensorError(f"amdsmi: the energy counter of {self.id} ran backward")
            return self._counter.update(raw) / 1e6
        w = self._watts()
        if self._last is None:
            self._last = (t_ns, w)
            return 0.0
        t0, w0 = self._last
        if t_ns > t0:
            self._joules += 0.5 * (w0 + w) * (t_ns - t0) / 1e9
            self._last = (t_ns, w)
        return self._joules

    def process_share(self) -> float:
        """This process's share of the GPU, in [0, 1]; never raises (share.py). Its process lists
        also tie the GPU to the rank that used it, as NVML's do."""
        return self.share()


def load_binding(binding: Any = None) -> Any:
    if binding is not None:
        return binding
    if BINDING is not None:
        return BINDING
    import amdsmi  # ROCm's binding; ImportError when it is not installed

    return amdsmi


def hip_env(env: Mapping[str, str]) -> dict[str, str]:
    """HIP's visibility variables as numbering.visible_order reads CUDA's: the first one set wins;
    ROCm numbers GPUs in PCI bus order."""
    out = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    for name in VISIBLE_ENV:
        if env.get(name) is not None:
            out["CUDA_VISIBLE_DEVICES"] = env[name]
            break
    return out


def discover(binding: Any = None, env: Mapping[str, str] | None = None, check_s: float = CHECK_S,
             explicit: bool = False) -> Discovery:
    import os

    try:
        smi = load_binding(binding)
    except ImportError:
        return amdsmi_absent(explicit)
    found = Discovery()
    try:
        smi.amdsmi_init()
        handles = list(smi.amdsmi_get_processor_handles())
    except Exception as exc:  # noqa: BLE001 - no driver, a VM guest, no permission
        found.missing["amdsmi"] = (f"amdsmi could not start ({exc}): is the amdgpu driver loaded, and is the user in "
                                   "the render group?")
        found.notes.append(f"amdsmi: cannot initialise ({exc}), so no AMD GPU is measured")
        return found
    if not handles:
        found.missing["amdsmi"] = "amdsmi found no AMD GPU"
        found.notes.append("amdsmi: no AMD GPU")
        return found
    gpus = []
    for i, h in enumerate(handles):
        bdf = _optional(lambda: text(smi.amdsmi_get_gpu_device_bdf(h)), "")
        asic = _optional(lambda: smi.amdsmi_get_gpu_asic_info(h), {}) or {}
        uuid = _optional(lambda: text(smi.amdsmi_get_gpu_device_uuid(h)), "")
        gpus.append(GpuInfo(i, h, parse_bus_id(bdf), bdf, uuid, str(asic.get("market_name") or f"AMD GPU {i}")))
    visible, notes = visible_order(gpus, hip_env(os.environ if env is None else env), None)
    found.notes.extend(n.replace("NVML:", "amdsmi:").replace("CUDA_VISIBLE_DEVICES", "the visible-devices variable")
                       for n in notes)
    devices = [AmdGpu(smi, g.handle) for g in visible]
    for index, (g, dev, (trusted, why)) in enumerate(zip(visible, devices, check_counters(devices, check_s))):
        detail: dict[str, Any] = {"name": g.name, "pci_bus_id": g.bus_id, "amdsmi_index": g.nvml_index, "hip_index": index}
        if trusted:
            detail["reading"] = "energy counter (energy_accumulator x counter_resolution, uJ)"
            found.sensors.append(AmdSmiSensor(f"gpu:{index}", dev, "counter", detail))
            continue
        try:
            w, key = dev.power()
        except SensorError as exc:
            w, key = None, str(exc)
        if w is None:
            found.notes.append(f"amdsmi: gpu:{index} ({g.name}) has no usable energy counter ({why}) and no power "
                               "reading; not measured")
            continue
        detail["reading"] = f"{key} (W), polled and integrated by trapezoids"
        detail["why_not_counter"] = why
        found.notes.append(f"amdsmi: gpu:{index} ({g.name}): {why}; polling {key} instead")
        found.sensors.append(AmdSmiSensor(f"gpu:{index}", dev, "power", detail))
    return found

