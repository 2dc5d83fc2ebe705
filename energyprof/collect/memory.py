"""Memory figures that need more than the RSS timeline.

Per-stack figures are the ledger's: RSS (and with memory=exact, tracemalloc's traced bytes)
is read by the sampler with each stack, so growth is charged to the stack running when it
was seen. The exact peak of a profiled call comes from the kernel's VmHWM
(probes.reset_peak and probes.read_peak).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.ledger import Ledger


def summary_of(ledger: Ledger) -> dict[str, Any]:
    """Baseline (RSS at the start, `Ledger.baseline_rss`) and sampled peak, for 'above baseline' figures
    of a run still going (a checkpoint has no profile yet)."""
    rss = [r for r in ledger.timeline.rss if r]
    baseline = ledger.baseline_rss(rss)
    return {"baseline_rss_bytes": baseline, "peak_rss_bytes": max(rss) if rss else baseline}
