"""Memory figures that need more than the RSS timeline.

Per-stack figures are the ledger's: RSS (and with memory=exact, tracemalloc's traced bytes)
is read by the sampler with each stack, so growth is charged to the stack running when it
was seen. The exact peak of a profiled call comes from the kernel's VmHWM
(probes.reset_peak and probes.read_peak).
"""

from __future__ import annotations

from typing import Any


def summary_of(first_tick: Any, rss_series: list[Any]) -> dict[str, Any]:
    """Baseline (RSS when profiling began) and sampled peak, for 'above baseline' figures, from the first
    reading and an RSS series (a checkpoint has no profile yet)."""
    rss = [r for r in rss_series if r]
    baseline = first_tick.rss_bytes if first_tick is not None and first_tick.rss_bytes else None
    if baseline is None and rss:
        baseline = rss[0]  # a supervised run's first reading precedes the program: its first RSS seen
    return {"baseline_rss_bytes": baseline, "peak_rss_bytes": max(rss) if rss else baseline}
