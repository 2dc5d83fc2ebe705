"""CUDA helpers: wait for launched GPU work, read the caching allocator. torch is never imported here:
a process that has not imported torch has no CUDA work to wait for, and importing it costs seconds."""

from __future__ import annotations

import sys
from typing import Any


def _cuda() -> Any:
    """torch.cuda if this process has imported torch and started CUDA, else None (never starts it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        return cuda if cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a CPU build, or torch half-imported
        return None


def cuda_sync(device: Any = None) -> None:
    """Wait for the GPU work already launched (on `device`, default the current one).

    CUDA kernels run asynchronously: without this, a window's end is stamped while its
    kernels still run, and their energy lands in whatever comes next. A no-op when torch is
    not imported or CUDA was never initialised. A CUDA error raised by the wait is the
    program's own (an earlier kernel failed) and propagates.
    """
    cuda = _cuda()
    if cuda is not None:
        cuda.synchronize(device)


def gpu_memory(device: Any = None) -> dict[str, int] | None:
    """{"allocated_bytes", "peak_bytes"} from torch's CUDA caching allocator, or None without CUDA."""
    cuda = _cuda()
    if cuda is None:
        return None
    return {"allocated_bytes": int(cuda.memory_allocated(device)), "peak_bytes": int(cuda.max_memory_allocated(device))}
