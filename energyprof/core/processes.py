"""The processes table: one row per process of the job, from what the ledger charged and what the
collector learnt of each (`Ledger.note_process`). Pure."""

from __future__ import annotations

from typing import Any

from ..facts.policy import check_policy
from .ledger import Ledger


def process_table(ledger: Ledger, policy: str) -> list[dict[str, Any]]:
    """One row per process the ledger followed; their energies add up to the program's attributed
    energy (what no sample carried, and processes not listed, count as the main one's)."""
    check_policy(policy)
    if not ledger.process_info:
        return []
    listed = ledger.process_info
    main = next((pid for pid, info in listed.items() if info.get("role") == "main"), next(iter(listed)))
    energy = {pid: [0.0] * ledger.n for pid in listed}
    energy[main], parts = ledger.program_parts(policy)
    for proc, part in parts.items():
        row = energy[proc if proc in listed else main]
        for i, v in enumerate(part):
            row[i] += v
    out = []
    for pid, info in listed.items():
        ps = ledger.procs.get(pid)
        cpu_ns = info.get("cpu_ns")
        out.append({
            "pid": pid,
            "parent_pid": info.get("parent_pid"),
            "command": info.get("command", ""),
            "role": info.get("role", "child"),
            "rank": info.get("rank"),
            "local_rank": info.get("local_rank"),
            "cpu_time_s": (cpu_ns if cpu_ns is not None else (ps.cpu_ns if ps else 0)) / 1e9,
            "energy_j": {sid: float(v) for sid, v in zip(ledger.source_ids, energy[pid])},
            "peak_rss_bytes": max(ps.peak_rss if ps else 0, int(info.get("peak_rss_bytes") or 0)) or None,
            "exit": info.get("exit"),
        })
    return out
