"""The report's first screen and its methodology, as plain data for the template (from the model)."""

from __future__ import annotations

from typing import Any


from ..record import field, record
from ..analysis.report import ReportModel
from .charts import path_shortener
from .format import TIER_TEXT, fmt_bytes, fmt_energy, fmt_error, fmt_grams, fmt_money, fmt_percent, fmt_power, fmt_seconds

IDLE_POLICIES = {
    "share": "The program is charged its share of each source: its CPU time over the machine's busy CPU "
             "time for CPU and DRAM, its share of the device for a GPU. The rest of what the sensors "
             "measured goes to the node [other processes and idle].",
    "all": "The program is charged everything the sensors measured while it ran, as on a dedicated "
           "machine (\u201cwhat did my job cost\u201d); nothing goes to other processes or idle.",
}


@record
class Card:
    """One summary figure; `lines` are (text, tag) pairs shown under it, tag '' or a method."""

    title: str
    value: str
    lines: list[tuple[str, str]] = field(default_factory=list)
    kind: str = ""


def pct(part: float, whole: float) -> str:
    return fmt_percent(part, whole)


def summary_cards(model: ReportModel) -> list[Card]:
    """Energy by source with its method, where it went, time, power, then carbon and memory."""
    t = model.totals
    total = model.total_energy_j
    duration = model.duration_s
    attributed = model.attributed_j
    idle = sum(t.idle_j.values())
    own = sum(t.energyprof_j.values())
    methods = sorted({s.method for s in model.sources})
    # The program's energy is the headline: every percentage on the page is a share of it.
    cards = [Card("Program's energy", fmt_energy(attributed), [
        (f"{attributed / 3600:.4g} Wh, {pct(attributed, total)} of the machine's", " + ".join(methods)),
        (f"idle policy: {model.policy}", ""),
    ], "attributed")]
    if model.modules:  # a training run's layers, each with its own backward, on the first screen
        cards.append(modules_card(model))
    cards.append(Card("Machine's energy", fmt_energy(total),
                      [(f"{s.id}: {fmt_energy(t.energy_j.get(s.id, 0.0))} ({s.sensor_text})", s.method)
                       for s in model.sources] + [
                      (f"{total / 3600:.4g} Wh; other processes and idle {fmt_energy(idle)},"
                       f" energyprof {fmt_energy(own)}", "")], "energy"))
    cards.append(Card("Duration", fmt_seconds(duration), [
        (f"CPU time, summed over threads and processes: {fmt_seconds(t.cpu_time_s)}; energyprof's:"
         f" {fmt_seconds(t.energyprof_cpu_time_s)}", ""),
    ], "duration"))
    peak = model.peak_power_w
    cards.append(Card("Average power", fmt_power(attributed / duration) if duration > 0 else "\u2013", [
        (f"the program's; the machine's: {fmt_power(total / duration) if duration > 0 else chr(8211)}", ""),
        (f"machine's peak: {fmt_power(peak)}", "")], "power"))
    c = model.carbon
    if c is not None:
        where = " ".join(str(x) for x in (c.country, c.region) if x)
        lines = [(f"the machine's: {fmt_grams(c.machine_g)} CO\u2082eq", ""),
                 (f"{c.intensity_g_per_kwh:.4g} g/kWh ({c.source} {where}".strip() + f"), PUE {c.pue:g}", "estimated")]
        if c.program_cost is not None:
            lines.insert(1, (f"cost: {fmt_money(c.program_cost, c.currency)} (the machine's "
                             f"{fmt_money(c.machine_cost, c.currency)})", ""))
        cards.append(Card("Carbon (program)", fmt_grams(c.program_g) + " CO\u2082eq", lines, "carbon"))
    m = model.memory
    if m.peak is not None:
        lines = []
        if m.peak_rss_exact_bytes is not None:
            lines.append((f"exact (kernel peak mark): {fmt_bytes(m.peak_rss_exact_bytes)}", "measured"))
            if m.peak_rss_bytes is not None:
                lines.append((f"sampled: {fmt_bytes(m.peak_rss_bytes)}", ""))
        if m.baseline_rss_bytes is not None:
            lines.append((f"at start: {fmt_bytes(m.baseline_rss_bytes)}", ""))
            lines.append((f"growth: {fmt_bytes(m.peak - m.baseline_rss_bytes)}", ""))
        cards.append(Card("Peak memory (RSS)", fmt_bytes(m.peak), lines, "memory"))
    return cards


MODULES_ON_CARD = 4


def modules_card(model: ReportModel) -> Card:
    """The model's heaviest modules against each other, each as forward + backward (analysis/phases.py):
    the figures of the function table's rows, with their ± (1/sqrt(samples))."""
    method = " + ".join(sorted({s.method for s in model.sources}))
    lines: list[tuple[str, str]] = []
    for row in model.modules[:MODULES_ON_CARD]:
        forward, backward = model.row_phases(row) or (0.0, 0.0)
        total = forward + backward
        err, berr = row.relative_error, row.backward_relative_error
        lines.append((f"{row.function}: {fmt_energy(total)}{fmt_error(err)} = forward {fmt_energy(forward)} + backward"
                      f" {fmt_energy(backward)}{fmt_error(berr)} ({pct(backward, total)} backward)", method))
    first = model.modules[0]
    return Card("Modules: forward + backward", f"{first.function} {fmt_energy(model.row_energy(first))}", lines, "modules")


#: notes that say how a figure was made, not that it may be wrong: they belong in Methodology
METHOD_NOTES = frozenset({"wait-cpu", "carbon", "io"})


def methodology(model: ReportModel) -> dict[str, Any]:
    """The facts a reader needs to trust (or distrust) the figures, in plain words."""
    meta = model.meta
    command = meta.get("command") or " ".join(str(a) for a in meta.get("argv", []))
    sources = [{**s.to_dict(), "detail_text": _detail_text(s.detail), "tier": s.tier_or_guess, "sensor_text": s.sensor_text,
                "tier_text": TIER_TEXT.get(s.tier_or_guess, s.tier_or_guess)} for s in model.sources]
    return {
        "sources": sources,
        "sensor_notes": list(meta.get("sensor_notes") or []),
        "policy": model.policy,
        "policy_text": IDLE_POLICIES.get(model.policy, "unknown policy"),
        "estimated": [s for s in sources if s["method"] == "estimated"],
        "has_gpu": any(s.component.startswith("gpu") for s in model.sources),
        "command": command,
        "processes": model.processes,
        # above the chart only what warns that figures may be off; how a figure was made goes to Methodology
        "notes": [n.message for n in model.notes if n.kind not in METHOD_NOTES],
        "method_notes": [n.message for n in model.notes if n.kind in METHOD_NOTES]
        + ([model.io_method] if model.io_method else []),
        "host": meta.get("host") or {},
        "settings": _settings_lines(meta.get("settings")),
        "exit": meta.get("exit") or {},
    }


def _settings_lines(settings: Any) -> list[tuple[str, str]]:
    """The machine's settings as (name, value) lines for "This run" (collect/settings.py reads them)."""
    if not isinstance(settings, dict) or not settings:
        return []
    from ..analysis.settings import flatten

    return sorted(flatten(settings).items())


def _detail_text(detail: Any) -> str:
    if not detail:
        return ""
    if isinstance(detail, dict):
        return ", ".join(f"{k}: {v}" for k, v in detail.items())
    return str(detail)


def process_rows(model: ReportModel) -> dict[str, Any]:
    """The job's processes as table rows; with ranks, the slowest (most CPU time) and the most
    energy-hungry rank are marked, since one slow rank holds every other one back."""
    procs = model.processes
    ranks = [p for p in procs if p.rank is not None]
    slowest = max(ranks, key=lambda p: p.cpu_time_s).pid if len(ranks) > 1 else None
    hungriest = max(ranks, key=lambda p: sum(p.energy_j.values())).pid if len(ranks) > 1 else None
    short = path_shortener(model)
    by_pid = {p.pid: p for p in procs}
    rows = []
    # ranks in order; otherwise the profile's order (the program first, each process after its parent)
    for p in sorted(procs, key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0)):
        energy = sum(p.energy_j.values())
        role = role_name(p, by_pid, bool(ranks))
        marks = [m for m, hit in (("slowest", p.pid == slowest), ("most energy", p.pid == hungriest)) if hit]
        exit_ = p.exit or {}
        rows.append({
            "pid": p.pid, "role": role, "command": p.command,
            "short_command": short_command(p.command, short),
            "energy": fmt_energy(energy) if p.energy_j else "\u2013",
            "share": fmt_percent(energy, model.program_j) if p.energy_j else "\u2013",
            "cpu": fmt_seconds(p.cpu_time_s), "rss": fmt_bytes(p.peak_rss_bytes),
            "exit": ", ".join(f"{k} {v}" for k, v in exit_.items()) if isinstance(exit_, dict) else str(exit_),
            "marks": ", ".join(marks),
        })
    return {"rows": rows, "ranks": len(ranks) > 1}


def role_name(p: Any, by_pid: dict[int, Any], ranked: bool) -> str:
    """What a process is to a reader: the program, the launcher of ranks, rank R (local L), a
    DataLoader worker (of rank R), or a child (of rank R)."""
    parent = by_pid.get(p.parent_pid) if p.parent_pid is not None else None
    of_rank = f" of rank {parent.rank}" if parent is not None and parent.rank is not None else ""
    if p.role == "rank" or (p.role == "main" and p.rank is not None):
        local = f" (local {p.local_rank})" if p.local_rank is not None and p.local_rank != p.rank else ""
        host = f" on {p.host}" if p.host else ""
        return f"rank {p.rank}{local}{host}"
    if p.role == "main":
        return "launcher" if ranked else "the program"
    if p.role == "worker":
        return "DataLoader worker" + of_rank
    return p.role + of_rank  # an engine's role (ray worker, dask worker, ...) as the facts hold it


def rank_epoch_rows(by_rank: dict[int, dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(rank, epoch row) pairs, epoch by epoch with the ranks of each epoch next to each other."""
    order: dict[Any, int] = {}
    for b in by_rank.values():
        for e in b["epochs"]:
            order.setdefault(e["epoch"], len(order))
    return sorted(((r, e) for r, b in by_rank.items() for e in b["epochs"]), key=lambda x: (order[x[1]["epoch"]], x[0]))


def short_command(command: str, short: Any) -> str:
    """A command line as a reader wants it: the interpreter by its name, a script relative to the
    program's folder (the whole line is in a tooltip)."""
    words = command.split(" ")
    if words and "/" in words[0]:
        words[0] = words[0].rsplit("/", 1)[1]
    words = [short(w) if w.startswith("/") and w.endswith(".py") else w for w in words]
    text = " ".join(words)
    return text if len(text) <= 70 else text[:69] + "\u2026"


def sweep_choice(model: ReportModel, name: str) -> str | None:
    """The label a program chose from a sweep (the power-limit optimizer's `chosen_w` fact), if any."""
    for row in model.windows:
        w = row.window
        if w.name.startswith(f"{name}:") and "chosen_w" in (w.loop or {}):
            return f"{w.loop['chosen_w']:g}W"
    return None
