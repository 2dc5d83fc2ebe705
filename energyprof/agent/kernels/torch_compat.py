"""torch's private surface that the op and kernel capture reads, in one place, with the torch versions
it was tested on. Everything here may change in any torch release: outside TESTED the capture that runs
by default turns itself off with a note (an explicit --gpu-kernels still runs, on the user's word).

- `prof.profiler.kineto_results.events()`: the cycle's events in memory (`_KinetoEvent`: name,
  activity_type, device_resource_id, start/end ns, correlation ids, sequence_nr, fwd_thread_id,
  python_id/python_parent_id, flow fields);
- `prof.profiler.kineto_results.experimental_event_tree()`: its Python calls' `extra_fields.module`
  (`_NNModuleInfo.self_ptr`, the module's id; `cls_name`), so `nn.Module: Linear_0` marks name a module;
- `torch._C._autograd._profiler_enabled()`: whether a profiler (the program's own) is on.

Kineto's log level (a C++ global set through ctypes), `Py_AddPendingCall` and the wrappers on
`torch.autograd.profiler._prepare_profiler` / `_run_on_profiler_start` / `_enable_profiler_legacy`
are in agent/kernel_capture.py, which imports nothing of torch's at import either.
"""

from __future__ import annotations

import sys
from typing import Any

# (major, minor) releases the capture was tested on: the CPU build of 2.13 (CI), whose event fields the
# reduction reads; the CUDA path last met real events on 2.x with Kineto's `kineto_results`.
TESTED = ((2, 13),)


def torch_version() -> tuple[int, int] | None:
    torch = sys.modules.get("torch")
    text = str(getattr(torch, "__version__", "") or "")
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def untested() -> str | None:
    """Why the default capture should stay off with this torch (one line), or None where it was tested."""
    version = torch_version()
    if version is None:
        return "the kernel capture is off: torch's version could not be read"
    if version not in TESTED:
        tested = ", ".join(f"{a}.{b}" for a, b in TESTED)
        return (f"the op and kernel capture is off by default with torch {version[0]}.{version[1]} (tested on {tested});"
                " --gpu-kernels runs it all the same")
    return None


def events(prof: Any) -> Any:
    """A finished cycle's events, in memory (no JSON)."""
    return prof.profiler.kineto_results.events()


def module_marks(prof: Any) -> dict[str, tuple[int, str]]:
    """The cycle's module-call marks (`nn.Module: Linear_0`, one name per module in a session) -> (the
    module's id, its class's name); empty where this torch has no event tree or no module info."""
    out: dict[str, tuple[int, str]] = {}
    try:
        todo = list(prof.profiler.kineto_results.experimental_event_tree())
    except Exception:  # noqa: BLE001 - no event tree in this torch: modules keep their class's name
        return out
    while todo:
        ev = todo.pop()
        try:
            todo.extend(ev.children)
            module = getattr(ev.extra_fields, "module", None)
            if module is not None:
                out.setdefault(ev.name, (int(module.self_ptr), str(module.cls_name)))
        except Exception:  # noqa: BLE001 - an event of another shape: skipped
            continue
    return out


def profiler_enabled() -> bool:
    """A PyTorch profiler is on in this process (Kineto, legacy, ITT or NVTX)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except Exception:  # noqa: BLE001 - no such call in this torch: go on as before
        return False


def release_cycle(prof: Any) -> None:
    """A reduced cycle's session let go: the next cycle starts a fresh one. torch would otherwise reuse the
    finished session and warn, once per process, that it clears events at each cycle: once energyprof's
    schedule had used that warning up, the program's own profiler would never show it."""
    try:
        prof.profiler = None
    except Exception:  # noqa: BLE001 - another shape: the warning may show (torch's, on energyprof's cycle)
        pass
