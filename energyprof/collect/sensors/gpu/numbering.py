"""Which GPUs CUDA sees and in what order: PCI bus ids, CUDA_VISIBLE_DEVICES, torch's own numbering.

Sources are named `gpu:N` with N the index *CUDA* gives the GPU (what `torch.device("cuda:N")`
means), not NVML's. NVML numbers GPUs by PCI bus id; CUDA does so too when
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, and otherwise puts the fastest first. When torch has already
initialised CUDA in this process we ask it for each device's PCI bus id (exact); otherwise we
assume PCI bus id order (exact on machines whose GPUs are all the same model, which is nearly
every training node; a note says so when they are not), then apply `CUDA_VISIBLE_DEVICES`
(indices, `GPU-<uuid>` prefixes; parsing stops at the first entry CUDA would reject, as CUDA does).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ....record import record


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse_bus_id(bus_id: Any) -> tuple[int, int, int, int] | None:
    """'00000000:3B:00.0' (or bytes, or the legacy '0000:3B:00.0') -> (domain, bus, device, function)."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    try:
        raw = str(bus_id).strip().rstrip("\x00")
        dom, bus, rest = raw.split(":")
        dev, fn = rest.split(".")
        return int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except (ValueError, AttributeError):
        return None


@record
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


def cuda_bus_ids_from_torch() -> list[tuple[int, int, int]] | None:
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
