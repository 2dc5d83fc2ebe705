"""NVIDIA GPUs through NVML (the nvidia-ml-py binding): one source per GPU that CUDA can see.

What is read, best first, per GPU:

1. the energy counter, `nvmlDeviceGetTotalEnergyConsumption` (mJ since the driver loaded;
   Volta and newer). Exact over any span longer than its update period.
2. the *instant* power field (`NVML_FI_DEV_POWER_INSTANT`, mW), integrated by trapezoids.
3. `nvmlDeviceGetPowerUsage` (mW), integrated, only when neither exists: on Ampere and newer it
   is a 1 s moving average, so a GPU that has the instant field never uses it.

Numbering. Sources are named `gpu:N` with N the index *CUDA* gives the GPU (what
`torch.device("cuda:N")` means), not NVML's. NVML numbers GPUs by PCI bus id; CUDA does so
too when `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and otherwise puts the fastest first. When torch has
already initialised CUDA in this process we ask it for each device's PCI bus id (exact);
otherwise we assume PCI bus id order (exact on machines whose GPUs are all the same model,
which is nearly every training node; a note says so when they are not), then apply
`CUDA_VISIBLE_DEVICES` (indices, `GPU-<uuid>` prefixes; parsing stops at the first entry
CUDA would reject, as CUDA does).

The binding is injectable (`discover(binding=...)` or the module attribute `BINDING`): tests
hand in a fake module with the same function names, the only thing they fake.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .. import probes
from .base import Discovery, Sensor, SensorError, WrapCounter

BINDING: Any = None  # a module object with pynvml's names; None: `import pynvml` (nvidia-ml-py)
DETECT_BUDGET_S = 0.3  # total time spent polling for update periods, all GPUs together
DETECT_POLL_S = 0.001
DEFAULT_UPDATE_PERIOD_S = 0.1  # A100/H100 refresh power about every 100 ms (FIELD-NOTES)
SHARE_REFRESH_S = 0.5  # how often the process list / utilisation is asked for
COUNTER_RANGE_MJ = 2**64  # an unsigned 64-bit value: kept as int, a float cannot hold it

_NVML_SUCCESS = 0
_MIG_ENABLE = 1


# -- the binding and its lifetime ------------------------------------------------------
def load_binding(binding: Any = None) -> tuple[Any, str | None]:
    """The NVML module to use, or None and a line saying why there is none."""
    if binding is not None:
        return binding, None
    if BINDING is not None:
        return BINDING, None
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None, "NVML: nvidia-ml-py is not installed (pip install 'energyprof[nvidia]'), so no GPU is measured"
    return pynvml, None


def _err(exc: BaseException) -> str:
    """An NVMLError's text; pynvml's __str__ itself calls into the library, so guard it."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        text = ""
    return text or f"{type(exc).__name__}({getattr(exc, 'value', '')})"


def _init_note(nv: Any, exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "NVML: no NVIDIA driver library (libnvidia-ml) on this machine, so no GPU is measured"
    if code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "NVML: the NVIDIA driver is not loaded (is there a GPU, and is the kernel module in?), so no GPU is measured"
    if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4):
        return "NVML: permission denied opening the NVIDIA driver, so no GPU is measured"
    return f"NVML: could not initialise ({_err(exc)}), so no GPU is measured"


class _Session:
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


# -- numbering ----------------------------------------------------------------------------
def parse_bus_id(bus_id: Any) -> tuple[int, int, int, int] | None:
    """'00000000:3B:00.0' (or bytes, or the legacy '0000:3B:00.0') -> (domain, bus, device, function)."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    try:
        text = str(bus_id).strip().rstrip("\x00")
        dom, bus, rest = text.split(":")
        dev, fn = rest.split(".")
        return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except (ValueError, AttributeError):
        return None


@dataclass
class GpuInfo:
    nvml_index: int
    handle: Any
    bus: tuple[int, int, int, int] | None
    bus_id: str
    uuid: str
    name: str

    @property
    def sort_key(self) -> tuple[Any, ...]:
        return (0, self.bus) if self.bus is not None else (1, self.nvml_index)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def visible_order(gpus: list[GpuInfo], env: dict[str, str] | None = None,
                  cuda_bus_ids: list[tuple[int, int, int]] | None = None) -> tuple[list[GpuInfo], list[str]]:
    """The GPUs CUDA sees, in CUDA's numbering, and notes on anything hidden or guessed.

    `cuda_bus_ids` (domain, bus, device) per CUDA index, when CUDA itself could be asked,
    is authoritative. Otherwise: PCI bus id order, then CUDA_VISIBLE_DEVICES.
    """
    env = os.environ if env is None else env
    notes: list[str] = []
    if cuda_bus_ids is not None:
        by_bus = {g.bus[:3]: g for g in gpus if g.bus is not None}
        out = [by_bus[b] for b in cuda_bus_ids if b in by_bus]
        if len(out) < len(cuda_bus_ids):
            notes.append("NVML: some CUDA devices have no matching NVML device (by PCI bus id); they are not measured")
        return out, notes
    ordered = sorted(gpus, key=lambda g: g.sort_key)
    order_env = env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    if order_env != "PCI_BUS_ID" and len({g.name for g in gpus}) > 1:
        notes.append("NVML: the GPUs are of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID, so CUDA may "
                     "number them fastest first; gpu:N assumes PCI bus order (set CUDA_DEVICE_ORDER=PCI_BUS_ID to be sure)")
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return ordered, notes
    visible: list[GpuInfo] = []
    for raw in spec.split(","):
        entry = raw.strip()
        found: GpuInfo | None = None
        if entry.isdigit():
            i = int(entry)
            found = ordered[i] if i < len(ordered) else None
        elif entry.upper().startswith("GPU-"):
            matches = [g for g in ordered if g.uuid.upper().startswith(entry.upper())]
            found = matches[0] if len(matches) == 1 else None
        elif entry.upper().startswith("MIG-"):
            notes.append(f"NVML: CUDA_VISIBLE_DEVICES names a MIG slice ({entry}); MIG slices have no energy "
                         "counter, so it is not measured")
            break
        if found is None or found in visible:
            if entry:
                notes.append(f"NVML: CUDA_VISIBLE_DEVICES entry {entry!r} matches no GPU; CUDA ignores it and "
                             "every entry after it, and so does energyprof")
            break
        visible.append(found)
    hidden = len(ordered) - len(visible)
    if hidden:
        notes.append(f"NVML: CUDA_VISIBLE_DEVICES={spec!r} hides {hidden} of {len(ordered)} GPU(s); "
                     "only the visible ones are measured")
    return visible, notes


def _cuda_bus_ids_from_torch() -> list[tuple[int, int, int]] | None:
    """Ask torch for CUDA's own numbering, but only if CUDA is already up (never start it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append((int(getattr(p, "pci_domain_id", 0)), int(p.pci_bus_id), int(p.pci_device_id)))
        return out
    except Exception:  # noqa: BLE001 - an old torch without the fields: fall back to the env
        return None


# -- readings -----------------------------------------------------------------------------
def _field_value(nv: Any, fv: Any) -> float | None:
    if getattr(fv, "nvmlReturn", _NVML_SUCCESS) != _NVML_SUCCESS:
        return None
    vt = getattr(fv, "valueType", 1)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(vt, "uiVal")
    return float(getattr(fv.value, member))


def _reader(nv: Any, handle: Any, kind: str) -> Callable[[], float]:
    """A zero-argument callable that returns the raw figure: mJ (counter, an int) or mW (power)."""
    if kind == "counter":
        return lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(handle))  # exact integer arithmetic
    if kind == "instant":
        field = nv.NVML_FI_DEV_POWER_INSTANT

        def instant() -> float:
            v = _field_value(nv, nv.nvmlDeviceGetFieldValues(handle, [field])[0])
            if v is None:
                raise SensorError("the instant power field stopped answering")
            return v

        return instant
    return lambda: float(nv.nvmlDeviceGetPowerUsage(handle))


def _choose_reading(nv: Any, handle: Any) -> tuple[str | None, str]:
    """Which figure this GPU offers (best first), and why the better ones are missing."""
    why = []
    try:
        nv.nvmlDeviceGetTotalEnergyConsumption(handle)
        return "counter", ""
    except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported before Volta
        why.append(f"no energy counter ({_err(exc)})")
    try:
        if hasattr(nv, "NVML_FI_DEV_POWER_INSTANT") and hasattr(nv, "nvmlDeviceGetFieldValues"):
            if _field_value(nv, nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_POWER_INSTANT])[0]) is not None:
                return "instant", "; ".join(why)
        why.append("no instant power field")
    except Exception as exc:  # noqa: BLE001
        why.append(f"no instant power field ({_err(exc)})")
    try:
        nv.nvmlDeviceGetPowerUsage(handle)
        return "average", "; ".join(why)
    except Exception as exc:  # noqa: BLE001
        why.append(f"no power reading ({_err(exc)})")
    return None, "; ".join(why)


def detect_update_periods(readers: list[Callable[[], float]], budget_s: float = DETECT_BUDGET_S,
                          poll_s: float = DETECT_POLL_S) -> list[float | None]:
    """How often each figure changes: poll all of them together for at most `budget_s`.

    The period is the median gap between observed changes; None when fewer than two changes
    were seen (a constant power reading, or a slow counter). Stops early once every reader
    has shown three gaps. A reader that raises is given None (read() will report it).
    """
    changes: list[list[float]] = [[] for _ in readers]
    last: list[float | None] = [None] * len(readers)
    dead = [False] * len(readers)
    end = time.perf_counter() + budget_s
    while True:
        now = time.perf_counter()
        for i, r in enumerate(readers):
            if dead[i]:
                continue
            try:
                v = r()
            except Exception:  # noqa: BLE001
                dead[i] = True
                continue
            if last[i] is not None and v != last[i]:
                changes[i].append(now)
            last[i] = v
        if now >= end or all(dead[i] or len(changes[i]) >= 4 for i in range(len(readers))):
            break
        time.sleep(poll_s)
    out: list[float | None] = []
    for ch in changes:
        gaps = [b - a for a, b in zip(ch, ch[1:])]
        out.append(statistics.median(gaps) if gaps else None)
    return out


# -- the sensor ---------------------------------------------------------------------------
READING_LABELS = {
    "counter": "energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ)",
    "instant": "instant power field (NVML_FI_DEV_POWER_INSTANT), integrated by trapezoids",
    "average": "nvmlDeviceGetPowerUsage (a 1 s average on Ampere and newer), integrated by trapezoids",
}


class NvmlSensor(Sensor):
    """Cumulative joules of one GPU, and this process's share of it (`process_share`)."""

    def __init__(self, source_id: str, nv: Any, session: _Session, gpu: GpuInfo, kind: str,
                 detail: dict[str, Any], update_period_s: float | None) -> None:
        super().__init__(id=source_id, component=source_id, method="measured", sensor="nvml", detail=detail,
                         update_period_s=update_period_s)
        self.nv = nv
        self.gpu = gpu
        self.kind = kind
        self._session = session
        session.acquire()
        self._raw = _reader(nv, gpu.handle, kind)
        self._counter: WrapCounter | None = None
        self._joules = 0.0
        self._last_t: int | None = None
        self._last_w = 0.0
        self._closed = False
        # process share: refreshed at most every SHARE_REFRESH_S, served from cache between
        self._share = 1.0
        self._share_at = -1e18
        self._util_ts = 0
        self._uses_cuda = False

    def _call(self) -> float:
        try:
            return self._raw()
        except SensorError:
            raise
        except Exception as exc:  # noqa: BLE001 - NVMLError: GPU lost, driver gone, ...
            raise SensorError(f"NVML error on {self.gpu.name} ({self.gpu.bus_id}): {_err(exc)}") from None

    def start(self, t_ns: int) -> None:
        raw = self._call()
        if self.kind == "counter":
            self._counter = WrapCounter(raw, COUNTER_RANGE_MJ)
        else:
            self._joules = 0.0
            self._last_t = t_ns
            self._last_w = raw / 1000.0
        self._share_at = -1e18

    def read(self, t_ns: int) -> float:
        if self.kind == "counter":
            raw = self._call()
            if self._counter is None:
                self._counter = WrapCounter(raw, COUNTER_RANGE_MJ)
            return self._counter.update(raw) / 1000.0
        watts = self._call() / 1000.0
        if self._last_t is None:
            self._last_t, self._last_w = t_ns, watts
            return 0.0
        dt = (t_ns - self._last_t) / 1e9
        if dt > 0:
            self._joules += 0.5 * (self._last_w + watts) * dt
            self._last_t, self._last_w = t_ns, watts
        return self._joules

    @property
    def wraps_and_resets(self) -> tuple[int, int]:
        c = self._counter
        return (c.wraps, c.resets) if c is not None else (0, 0)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        wraps, resets = self.wraps_and_resets
        if resets:
            out["detail"]["counter_resets"] = resets
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._session.release()

    # -- share of a shared GPU ------------------------------------------------------------
    def process_share(self) -> float:
        """This process's share of the GPU, in [0, 1]; never raises, never blocks for long.

        1 when this process (or one of its children) is the only compute process on the GPU.
        Shared with others: its share of SM utilisation when the driver reports per-process
        utilisation, else an equal split between the compute processes (an estimate either
        way). No compute process at all, or not listed: 1 if this process has CUDA loaded
        (containers hide its host pid from it), else 0 (the GPU's draw is someone else's or idle).
        """
        now = time.monotonic()
        if now - self._share_at < SHARE_REFRESH_S:
            return self._share
        self._share_at = now
        try:
            self._share = self._compute_share()
        except Exception:  # noqa: BLE001 - keep the last figure
            pass
        return self._share

    def _compute_share(self) -> float:
        nv, h = self.nv, self.gpu.handle
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            pids = {int(p.pid) for p in procs}
        except Exception:  # noqa: BLE001 - not supported / no permission
            return 1.0 if self._process_uses_cuda() else 0.0
        ours = _own_pids()
        mine = pids & ours
        if not pids:
            return 1.0 if self._process_uses_cuda() else 0.0
        if not mine:
            # Either another job's GPU, or a container whose pids NVML reports from the host.
            return 1.0 / len(pids) if self._process_uses_cuda() else 0.0
        if mine == pids:
            return 1.0
        util = self._utilisation_share(ours)
        return util if util is not None else len(mine) / len(pids)

    def _utilisation_share(self, ours: set[int]) -> float | None:
        fn = getattr(self.nv, "nvmlDeviceGetProcessUtilization", None)
        if fn is None:
            return None
        try:
            samples = fn(self.gpu.handle, self._util_ts)
        except Exception:  # noqa: BLE001 - NOT_FOUND: no sample since the last call
            return None
        total = mine = 0.0
        for s in samples:
            sm = float(getattr(s, "smUtil", 0) or 0)
            total += sm
            if int(s.pid) in ours:
                mine += sm
            self._util_ts = max(self._util_ts, int(getattr(s, "timeStamp", 0) or 0))
        return mine / total if total > 0 else None

    def _process_uses_cuda(self) -> bool:
        if self._uses_cuda:
            return True
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                self._uses_cuda = True
                return True
        except Exception:  # noqa: BLE001
            pass
        try:
            with open("/proc/self/maps", "rb") as fh:
                self._uses_cuda = b"libcuda.so" in fh.read()
        except OSError:
            pass
        return self._uses_cuda


def _own_pids() -> set[int]:
    pids = {os.getpid()}
    kids = probes.descendant_pids()
    if kids is None:
        try:
            import psutil

            kids = [c.pid for c in psutil.Process().children(recursive=True)]
        except Exception:  # noqa: BLE001
            kids = []
    pids.update(kids)
    return pids


# -- discovery ----------------------------------------------------------------------------
def discover(binding: Any = None, env: dict[str, str] | None = None,
             detect_budget_s: float | None = None) -> Discovery:
    """One sensor per GPU CUDA can see, and a note for each one it cannot measure, and why."""
    found = Discovery()
    nv, why = load_binding(binding)
    if nv is None:
        found.notes.append(why or "NVML: unavailable")
        return found
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        found.notes.append(_init_note(nv, exc))
        return found
    session = _Session(nv)
    session.acquire()  # discovery's own hold, released below
    try:
        _discover(nv, session, found, env, DETECT_BUDGET_S if detect_budget_s is None else detect_budget_s)
    except Exception as exc:  # noqa: BLE001 - never let a driver quirk stop the program
        for s in found.sensors:
            s.close()
        found.sensors = []
        found.notes.append(f"NVML: GPU discovery failed ({_err(exc)}), so no GPU is measured")
    finally:
        session.release()
    return found


def _discover(nv: Any, session: _Session, found: Discovery, env: dict[str, str] | None, budget: float) -> None:
    count = int(nv.nvmlDeviceGetCount())
    if count == 0:
        found.notes.append("NVML: the driver is loaded but reports no GPU")
        return
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
    except Exception:  # noqa: BLE001
        driver = "unknown"
    gpus: list[GpuInfo] = []
    for i in range(count):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except Exception as exc:  # noqa: BLE001
            found.notes.append(f"NVML: GPU {i} cannot be opened ({_err(exc)}); not measured")
            continue
        try:
            bus_raw = nv.nvmlDeviceGetPciInfo(h).busId
        except Exception:  # noqa: BLE001
            bus_raw = ""
        gpus.append(GpuInfo(i, h, parse_bus_id(bus_raw), _text(bus_raw).rstrip("\x00"),
                            _optional(lambda: _text(nv.nvmlDeviceGetUUID(h)), ""),
                            _optional(lambda: _text(nv.nvmlDeviceGetName(h)), f"GPU {i}")))
    visible, notes = visible_order(gpus, env, _cuda_bus_ids_from_torch() if env is None else None)
    found.notes.extend(notes)
    planned: list[tuple[int, GpuInfo, str, str]] = []
    for cuda_index, g in enumerate(visible):
        label = f"gpu:{cuda_index} ({g.name}, {g.bus_id or 'bus id unknown'})"
        mig = _optional(lambda: nv.nvmlDeviceGetMigMode(g.handle)[0], 0)
        if mig == _MIG_ENABLE:
            found.notes.append(f"NVML: {label} is in MIG mode; MIG slices have no energy counter and the GPU's "
                               "total cannot be split between slices, so it is not measured")
            continue
        kind, why = _choose_reading(nv, g.handle)
        if kind is None:
            found.notes.append(f"NVML: {label} offers no energy or power reading ({why}); not measured")
            continue
        if kind == "average":
            found.notes.append(f"NVML: {label} has no energy counter and no instant power field; integrating "
                               "nvmlDeviceGetPowerUsage, which newer drivers average over 1 s")
        planned.append((cuda_index, g, kind, why))
    if not planned:
        return
    periods = detect_update_periods([_reader(nv, g.handle, kind) for _, g, kind, _ in planned], budget)
    for (cuda_index, g, kind, why), period in zip(planned, periods):
        limit = _optional(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(g.handle) / 1000.0, None)
        detail: dict[str, Any] = {
            "name": g.name, "nvml_index": g.nvml_index, "cuda_index": cuda_index, "pci_bus_id": g.bus_id,
            "uuid": g.uuid, "power_limit_w": limit, "driver": driver, "reading": READING_LABELS[kind],
            "update_period_detected": period is not None,
        }
        if why:
            detail["why_not_counter"] = why
        sid = f"gpu:{cuda_index}"
        found.sensors.append(NvmlSensor(sid, nv, session, g, kind, detail,
                                        period if period is not None else DEFAULT_UPDATE_PERIOD_S))


def _optional(fn: Callable[[], Any], default: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - optional metadata: a missing field is not an error
        return default
