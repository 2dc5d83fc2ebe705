"""`import energyprof.torch as ept`: the PyTorch integration under a short public name.

The code lives in `energyprof.integrations.torch`; this module only re-exports it, so that
the user-facing name stays stable while integrations move around.
"""

from __future__ import annotations

from .integrations.torch import (  # noqa: F401
    StepRecord,
    TrackedLoader,
    breakdown,
    cuda_sync,
    gpu_memory,
    track,
    window,
)

__all__ = ["StepRecord", "TrackedLoader", "breakdown", "cuda_sync", "gpu_memory", "track", "window"]
