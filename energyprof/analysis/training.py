"""The training-loop breakdown: wait, data-pipeline work, compute and fetch stall per step. Pure.

Definitions (the edge-training studies'):
- *wait*: the time the loop blocked in the loader's `next()`;
- *pipeline* (fetch + preprocess): the data pipeline's work per batch, measured where it runs:
  inside `next()` with no workers (so it equals the wait), in the worker that built the batch
  otherwise (the dataset's `__getitems__`/`__getitem__` plus collate);
- *preprocess*: work the loop itself marked with `tracked.preprocess()` (main process);
- *compute*: the rest of the step (forward, backward, optimizer step), split into those three phases
  by analysis/phases.py's rule (`split_span`): the tree has no time axis, so each step's measured compute
  energy is split in the shares that backward's and the optimizer's frames hold of the loop's (estimated);
- *epoch*: a window `epoch` when the program marks them, else each pass of `track(loader, epochs=N)`
  (its `<name>.pass` window).

Fetch stall per step: with no workers nothing overlaps, stall = pipeline + preprocess. With N
prefetching workers the batches arrive N at a time, so the loop waits
max(pipeline / N - (compute + preprocess), 0) and then preprocesses: stall = that + preprocess.
With no loop preprocess this is the studies' max((fetch + preprocess) / N - compute, 0).
The predicted wait is shown beside the observed one; when they disagree by more than
`DISAGREEMENT` the pipeline is bound by something the model leaves out (disk, collate, transfer).
"""

from __future__ import annotations

import bisect
import re
from typing import Any, Iterable, Mapping

from ..facts.profile import Node
from ..facts.profile import Profile
from ..facts.profile import Window
from .io import io_in_span, io_of
from .kinds import is_cache_fact, window_program_j  # noqa: F401 - their home is kinds.py; named here as before
from .functions import relative_error
from .phases import Split, is_backward_frame, is_optimizer_frame, split_span, tree_split

DISAGREEMENT = 0.20  # predicted and observed wait further apart than this: say so
NOISE_FLOOR = 0.05  # ...unless the gap is under this share of the epoch's loop time (both near zero)
WORKER_NODE = re.compile(r"^\[DataLoader worker \d+\]")
STALL_DEFINITION = ("no workers: pipeline + preprocess; N workers: max(pipeline / N - (compute + preprocess), 0)"
                    " + preprocess, per step")


# -- the profile's facts this module reads (one place, so a new Profile shape is a few lines) --------
def _windows(profile: Profile, rank: int | None = None) -> list[Window]:
    """The profile's windows; with `rank`, only those that rank marked (each rank counts its own steps)."""
    return [w for w in profile.windows if rank is None or w.rank == rank]


def hold_program(windows: Iterable[Window]) -> bool:
    """Whether every window holds the program's part; False when one was written before windows held it,
    and then a view shows the machine's figure for all of them alike."""
    return all(w.program_total_j is not None for w in windows)


def _machine_energy(w: Window) -> float:
    """Everything the sensors measured in the window: shown beside the program's, never in its place."""
    return float(w.total_j)


def _program_by_source(w: Window) -> dict[str, float]:
    return dict(w.program_energy_j) if w.program_energy_j else dict(w.energy_j)


def energy_of(windows: Iterable[Window]) -> str:
    """Whose energy the breakdown's figures are: "program" when every window holds the program's part,
    else "machine" (a file written before windows held it)."""
    return "program" if hold_program(windows) else "machine"


def _worker_nodes(profile: Profile, rank: int | None = None) -> list[Node]:
    """Process nodes of DataLoader workers (outermost only: a worker's subtree is inside its figure);
    with `rank`, those under that rank's `[rank R]` node when the tree has one."""
    out, stack = [], (profile.find(f"[rank {rank}]") if rank is not None else []) or [profile.root]
    while stack:
        node = stack.pop()
        if WORKER_NODE.match(node.function):
            out.append(node)
            continue
        stack.extend(node.children)
    return out


# -- the formula ------------------------------------------------------------------------------
def predicted_wait_s(pipeline_s: float, preprocess_s: float, compute_s: float, workers: int) -> float:
    """How long the loop should block in next() for one step, from the pipeline's work."""
    if workers <= 0:
        return pipeline_s
    return max(pipeline_s / workers - (compute_s + preprocess_s), 0.0)


def stall_s(pipeline_s: float, preprocess_s: float, compute_s: float, workers: int) -> float:
    """The fetch stall of one step: the part of the data pipeline that did not overlap compute."""
    return predicted_wait_s(pipeline_s, preprocess_s, compute_s, workers) + preprocess_s


# -- from the tracker's timings ---------------------------------------------------------------------
def loop_breakdown(steps: Iterable[Mapping[str, Any]], warmup: int = 0) -> dict[str, Any]:
    """Per-epoch sums of a tracked loop's timings, with the stall and the observed wait side by side.

    `steps` are dicts with step, epoch, wait_s, pipeline_s (None: not measured), preprocess_s,
    compute_s, workers and startup (a step whose batch came from a worker started in that pass,
    its first: its wait is start-up, counted in its own row, not in the wait or the stall). The first `warmup`
    epochs are left out of the means, and the result says which.
    """
    import statistics  # here, not at the top: 3 ms of every run's report, most without a loop

    by_epoch: dict[Any, list[Mapping[str, Any]]] = {}
    for s in steps:
        by_epoch.setdefault(s["epoch"], []).append(s)
    epochs = [_epoch_row(e, rows) for e, rows in by_epoch.items()]
    order = [e["epoch"] for e in epochs]
    left_out = order[:max(warmup, 0)]
    kept = [e for e in epochs if e["epoch"] not in left_out]
    keys = ("wait_s", "pipeline_s", "preprocess_s", "compute_s", "stall_s", "predicted_wait_s", "startup_s", "time_s")
    means = {k: statistics.fmean([e[k] for e in kept]) if kept and all(e[k] is not None for e in kept) else None
             for k in keys}
    notes = [n for e in epochs for n in e["notes"]]
    if left_out:
        notes.append(f"epoch means leave out the warm-up epoch(s) {', '.join(str(e) for e in left_out)}")
    return {"epochs": epochs, "mean": means, "warmup_epochs": left_out, "notes": notes,
            "stall_definition": STALL_DEFINITION}


def _epoch_row(epoch: Any, rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    workers = max((int(r.get("workers") or 0) for r in rows), default=0)
    startup = [r for r in rows if r.get("startup")]
    steady = [r for r in rows if not r.get("startup")]
    measured = all(r.get("pipeline_s") is not None or not r.get("workers") for r in steady)
    row: dict[str, Any] = {"epoch": epoch, "steps": len(rows), "workers": workers,
                           "startup_s": sum(r["wait_s"] for r in startup) if workers else 0.0,
                           "wait_s": sum(r["wait_s"] for r in steady),
                           "preprocess_s": sum(r.get("preprocess_s", 0.0) for r in rows),
                           "compute_s": sum(r["compute_s"] for r in rows)}
    row["time_s"] = sum(r["wait_s"] + r.get("preprocess_s", 0.0) + r["compute_s"] for r in rows)
    if measured:
        pipe = [_pipeline(r) for r in steady]
        row["pipeline_s"] = sum(pipe)
        row["predicted_wait_s"] = sum(predicted_wait_s(p, r.get("preprocess_s", 0.0), r["compute_s"], int(r.get("workers") or 0))
                                      for p, r in zip(pipe, steady))
        row["stall_s"] = row["predicted_wait_s"] + sum(r.get("preprocess_s", 0.0) for r in steady)
    else:
        row["pipeline_s"] = row["predicted_wait_s"] = row["stall_s"] = None
    row["fetch_s"] = row["pipeline_s"]  # the pipeline's work: fetch + preprocess where it runs
    row["notes"] = _agreement(row)
    row["agrees"] = not row["notes"] if measured else None
    return row


def _pipeline(r: Mapping[str, Any]) -> float:
    return float(r["wait_s"] if not r.get("workers") else r["pipeline_s"])


def _agreement(row: Mapping[str, Any]) -> list[str]:
    predicted, observed = row["predicted_wait_s"], row["wait_s"]
    if predicted is None:
        return [f"epoch {row['epoch']}: the workers' pipeline time was not measured, so no stall is computed"]
    gap = abs(predicted - observed)
    if gap <= DISAGREEMENT * max(predicted, observed) or gap <= NOISE_FLOOR * row["time_s"]:
        return []
    side = "longer" if observed > predicted else "shorter"
    return [f"epoch {row['epoch']}: the loop waited {observed:.3g} s for data, {side} than the {predicted:.3g} s"
            " the pipeline's own work explains: it is bound by something else (disk, the collate function,"
            " moving batches from the workers or to the device, or the workers' share of the CPUs)"]


# -- from a profile's windows (energy) --------------------------------------------------------------
def breakdown(profile: Profile, name: str = "step", epoch_window: str = "epoch", warmup: int = 0,
              steps: Iterable[Mapping[str, Any]] | None = None, rank: int | None = None) -> dict[str, Any]:
    """The split with energy, from a finished (or loaded) profile's windows.

    Windows `<name>.fetch` (the wait in next()), `<name>.preprocess` and `<name>.compute`,
    index = step, grouped by the `epoch_window` window that holds them. A tracked loop's fetch
    windows hold the workers' timings (`loop`: the worker's time on the batch, written by
    `energyprof.torch.track`), so the stall of a loop with workers comes from the profile
    alone; `steps` (the tracker's records, `tracked.records()`) take their place when given.
    With neither, the loop is taken to have no workers (the pipeline is the wait), unless the
    profile has DataLoader worker processes, in which case the stall is None.
    `rank`: only that rank's windows (a distributed job's ranks count steps each from 0, so their
    windows cannot be paired across ranks).
    """
    windows = _windows(profile, rank)

    def named(suffix: str) -> list[Window]:
        return [w for w in windows if w.name == f"{name}.{suffix}" and w.index is not None]

    epochs = [w for w in windows if w.name == epoch_window]
    # without the program's own epoch windows, a tracked loop's passes are its epochs
    epochs_from = epoch_window if epochs else f"{name}.pass"
    epochs = epochs or [w for w in windows if w.name == f"{name}.pass" and w.index is not None]
    fetches = named("fetch")
    rows, used = _step_rows(named("compute"), fetches, named("preprocess"), epochs)
    phases = split_steps(rows, loop_split(profile, name, rank))
    workers = _worker_nodes(profile, rank)
    if steps is None:
        steps = _saved_timings(fetches, rows)
    timing = _timings(rows, steps, has_workers=bool(workers))
    loop = loop_breakdown(timing, warmup) if timing is not None else None
    per_epoch = _epoch_rows(rows, epochs, loop, io_of(profile), _residency_by_epoch(windows, name, epochs))
    return {
        "name": name,
        "steps": rows,
        "epochs": per_epoch,
        "epochs_from": epochs_from if epochs else None,  # the windows each epoch is (None: no epochs)
        "phases": phases,  # the steps' forward, backward and optimizer (None: the tree shows no training)
        "end_of_data_waits": _end_of_data_waits(fetches, used),
        # whose energy every *_j figure here is: the program's part of each window ("program"), or the
        # machine's in a file written before windows held the program's part ("machine")
        "energy_of": energy_of(w for w in windows if w.name.startswith(f"{name}.")),
        "step_energy_j": _spread([r["energy_j"] for r in rows]),
        "machine_step_energy_j": _spread([r["machine_energy_j"] for r in rows]),
        # the workers' processes as a whole (the tree has no time axis to split them per epoch);
        # None when the profile has no worker process nodes
        "workers_energy_j": _sum_energy(workers) if workers else None,
        **_per_unit(rows, per_epoch, fetches),
        "warmup_epochs": loop["warmup_epochs"] if loop else [],
        "notes": _loop_notes(loop),
        "stall_definition": STALL_DEFINITION,
    }


def _step_rows(computes: list[Window], fetches: list[Window], preprocesses: list[Window],
               epochs: list[Window]) -> tuple[list[dict[str, Any]], set[int]]:
    """One row per step (its compute window with its fetch and preprocess windows), in time order; and the
    indices of the fetches that belong to a step."""
    used: set[int] = set()
    rows = []
    for c in sorted(computes, key=lambda w: w.start_s):
        f = _fetch_of(c, fetches, used)
        pre = [p for p in preprocesses if p.index == c.index
               and c.start_s - 1e-6 <= p.start_s and p.end_s <= c.end_s + 1e-6]
        rows.append(_step_row(c, f, pre, epochs))
    rows.sort(key=lambda r: r["start_s"])
    return rows, used


def _fetch_of(c: Window, fetches: list[Window], used: set[int]) -> Window | None:
    """A compute window's fetch: same index, the last one to end before it began (the end-of-data fetch of
    the previous pass carries the same index as the next pass's first step); marked in `used`."""
    cands = [i for i, f in enumerate(fetches) if i not in used and f.index == c.index and f.end_s <= c.start_s + 1e-6]
    if not cands:
        return None
    i = max(cands, key=lambda i: fetches[i].end_s)
    used.add(i)
    return fetches[i]


def _step_row(c: Window, f: Window | None, pre: list[Window], epochs: list[Window]) -> dict[str, Any]:
    r: dict[str, Any] = {"step": int(c.index), "start_s": f.start_s if f else c.start_s}
    r["wait_s"] = f.time_s if f else 0.0
    r["wait_j"] = window_program_j(f) if f else 0.0
    r["preprocess_s"] = sum(p.time_s for p in pre)
    r["preprocess_j"] = sum(window_program_j(p) for p in pre)
    # the preprocess windows are nested in compute: take them out so the phases are disjoint
    r["compute_s"] = max(c.time_s - r["preprocess_s"], 0.0)
    r["compute_j"] = max(window_program_j(c) - r["preprocess_j"], 0.0)
    by_source = _program_by_source(c)
    for sid, j in (_program_by_source(f) if f else {}).items():
        by_source[sid] = by_source.get(sid, 0.0) + j
    r["by_source"] = by_source  # the program's, like every energy of the row
    r["time_s"] = r["wait_s"] + r["preprocess_s"] + r["compute_s"]
    r["energy_j"] = r["wait_j"] + r["preprocess_j"] + r["compute_j"]
    # the machine's over the same phases (the preprocess windows are inside compute: counted once)
    r["machine_energy_j"] = (_machine_energy(f) if f else 0.0) + max(_machine_energy(c), 0.0)
    r["fetch_s"], r["fetch_j"] = r["wait_s"], r["wait_j"]  # the names the report's template reads
    r["epoch"] = next((e.index for e in epochs if e.start_s <= r["start_s"] < e.end_s), None)
    r["samples"] = int(f.loop["samples"]) if f is not None and "samples" in f.loop else None
    r["end_s"] = c.end_s
    return r


def _end_of_data_waits(fetches: list[Window], used: set[int]) -> list[dict[str, Any]]:
    """The fetches of no step: next() found the loader exhausted."""
    return [{"after_step": int(f.index) - 1, "time_s": f.time_s, "energy_j": window_program_j(f),
             "machine_energy_j": _machine_energy(f)}
            for i, f in enumerate(fetches) if i not in used]


def _epoch_rows(rows: list[dict[str, Any]], epochs: list[Window], loop: dict[str, Any] | None,
                io: Any, residency: dict[Any, tuple[float | None, float | None]]) -> list[dict[str, Any]]:
    """Per epoch: its steps' sums, samples, disk and page cache, and the loop's stall beside them."""
    per_epoch: dict[Any, dict[str, Any]] = {}
    for r in rows:
        e = per_epoch.setdefault(r["epoch"], {"epoch": r["epoch"], "steps": 0, **{k: 0.0 for k in _SUMMED}})
        e["steps"] += 1
        for k in _SUMMED:
            e[k] += r[k]
    phased = bool(rows) and "backward_j" in rows[0]
    for e in per_epoch.values():
        mine = [r for r in rows if r["epoch"] == e["epoch"]]
        if phased:
            for k in PHASE_KEYS:
                e[k] = sum(r[k] for r in mine)
        e["samples"] = sum(r["samples"] for r in mine) if all(r["samples"] is not None for r in mine) else None
        e["energy_per_sample_j"] = e["energy_j"] / e["samples"] if e["samples"] else None
        e["machine_energy_per_sample_j"] = e["machine_energy_j"] / e["samples"] if e["samples"] else None
        _add_epoch_disk(e, mine, epochs, io)
        if e["epoch"] in residency:  # the dataset's page-cache share at the epoch's start and end (measured)
            e["cache_start"], e["cache_end"] = residency[e["epoch"]]
        t = next((x for x in (loop or {}).get("epochs", []) if x["epoch"] == e["epoch"]), None)
        for k in ("stall_s", "predicted_wait_s", "pipeline_s", "startup_s", "workers", "agrees"):
            e[k] = t[k] if t else None
        e["fetch_s"], e["fetch_j"] = e["wait_s"], e["wait_j"]  # the names the report's template reads
    return list(per_epoch.values())


def _add_epoch_disk(e: dict[str, Any], mine: list[dict[str, Any]], epochs: list[Window], io: Any) -> None:
    """The disk beside the stall: measured over the epoch's window, else its steps' span."""
    ew = next((w for w in epochs if w.index == e["epoch"]), None)
    a, b = (ew.start_s, ew.end_s) if ew is not None else (min(r["start_s"] for r in mine), max(r["end_s"] for r in mine))
    span = io_in_span(io, a, b) if io and mine else None
    if span is not None:
        e["read_mb"], e["read_iops"] = span["disk_read_mb"], span["read_iops"]
        e["process_read_mb"], e["disk_busy_share"] = span["process_read_mb"], span["disk_busy_share"]


def _spread(energies: list[float]) -> dict[str, Any]:
    import statistics  # here, not at the top: 3 ms of every run's report, most without a loop

    return {"mean": statistics.fmean(energies) if energies else 0.0,
            "stdev": statistics.stdev(energies) if len(energies) > 1 else 0.0,
            "n": len(energies)}


def _loop_notes(loop: dict[str, Any] | None) -> list[str]:
    notes = list(loop["notes"]) if loop else []
    if loop is None:
        notes.append("the loop has DataLoader workers but the profile holds no worker timings (a loop not"
                     " tracked with energyprof.torch.track, or a profile written before they were kept):"
                     " pass the tracker's records for the stall")
    return notes


def _residency_by_epoch(windows: list[Window], name: str, epochs: list[Window]) -> dict[Any, tuple[float | None, float | None]]:
    """Per epoch (its window holding the measurement; None without epoch windows): the residency at the first
    pass's start and the last pass's end within it."""
    out: dict[Any, list[float | None]] = {}
    for w in sorted(windows, key=lambda w: w.start_s):
        if w.name not in (f"{name}.cache.start", f"{name}.cache.end") or "residency" not in w.loop:
            continue
        epoch = next((e.index for e in epochs if e.start_s <= w.start_s <= e.end_s), None)
        slot = out.setdefault(epoch, [None, None])
        if w.name.endswith(".start") and slot[0] is None:
            slot[0] = w.loop["residency"]
        elif w.name.endswith(".end"):
            slot[1] = w.loop["residency"]
    return {k: (v[0], v[1]) for k, v in out.items()}


def _per_unit(rows: list[dict[str, Any]], epochs: list[dict[str, Any]], fetches: list[Window]) -> dict[str, Any]:
    """The loop's energy per step, per sample and per epoch (the steps' energy, measured windows), with the
    counts they divide by and the model's parameter count where the tracker recorded them. The figures
    are the program's (its part of each window, as the headline is); `machine_*` are the machine's over
    the same windows, everything the sensors measured, shown beside them."""
    samples = [r["samples"] for r in rows]
    n_samples = sum(samples) if samples and all(x is not None for x in samples) else None
    whole = [e for e in epochs if e["epoch"] is not None]
    params = next((int(f.loop["parameters"]) for f in fetches if "parameters" in f.loop), None)
    out: dict[str, Any] = {"step_count": len(rows), "sample_count": n_samples, "epoch_count": len(whole),
                           "parameters": params}
    for prefix, key in (("", "energy_j"), ("machine_", "machine_energy_j")):
        energy = sum(r[key] for r in rows)
        out[f"{prefix}training_energy_j"] = energy
        out[f"{prefix}energy_per_step_j"] = energy / len(rows) if rows else None
        out[f"{prefix}energy_per_sample_j"] = energy / n_samples if n_samples else None
        out[f"{prefix}energy_per_epoch_j"] = sum(e[key] for e in whole) / len(whole) if whole else None
    return out


PHASE_KEYS = ("forward_j", "backward_j", "optimizer_j")
PHASES_BASIS = ("each step's measured compute energy, split in the shares of the loop's compute that the tree's backward"
                " ([backward] and torch's backward() frames) and optimizer (torch.optim, zero_grad) frames hold; forward"
                " is the rest of the step")
TRAINING_EVIDENCE = 0.5  # of several loops, one whose compute ran at least this share beside backward or an optimizer


# -- forward, backward and optimizer per step (analysis/phases.py's rule) -------------------------
def split_steps(rows: list[dict[str, Any]], split: Split | None) -> dict[str, Any] | None:
    """Each step's compute split into forward, backward and optimizer (added to its row), and the loop's
    figures; None without backward or optimizer energy. The tree has no time axis: every step takes the
    loop's shares (estimated), so the steps add up to the loop."""
    if split is None or not rows:
        return None
    compute = sum(r["compute_j"] for r in rows)
    forward, backward, optimizer = split_span(compute, split.backward_j, split.optimizer_j)
    for r in rows:
        share = r["compute_j"] / compute if compute > 0 else 0.0
        r["forward_j"], r["backward_j"], r["optimizer_j"] = split_span(r["compute_j"], backward * share, optimizer * share)
    return {"forward_j": forward, "backward_j": backward, "optimizer_j": optimizer,
            "backward_relative_error": relative_error(split.backward_samples),
            "optimizer_relative_error": relative_error(split.optimizer_samples),
            "method": "estimated", "basis": PHASES_BASIS}


def loop_split(profile: Profile, name: str, rank: int | None = None) -> Split | None:
    """The tree's backward and optimizer energy that belong to this loop (None: none). Only loops whose compute
    ran beside backward's or the optimizer's frames (the timeline's functions) share it, in proportion to their
    compute energy: one tracked loop too (a forward-only loop beside untracked training gets none), and
    without that evidence (no timeline) none gets any."""
    root = profile.find(f"[rank {rank}]") if rank is not None else [profile.root]
    if not root:  # a rank's loop in a tree with no node of that rank: the others' backward is not its own
        return None
    split = tree_split(root[0])
    if split.backward_j <= 0 and split.optimizer_j <= 0:
        return None
    computes: dict[str, list[Window]] = {}
    for w in _windows(profile, rank):
        if w.name.endswith(".compute") and w.index is not None:
            computes.setdefault(w.name[:-len(".compute")], []).append(w)
    training = _training_loops(profile, computes)
    if name not in training:
        return None
    energy = {n: sum(window_program_j(w) for w in ws) for n, ws in computes.items()}
    whole = sum(energy[n] for n in training)
    share = energy.get(name, 0.0) / whole if whole > 0 else 0.0
    return Split(split.forward_j * share, split.backward_j * share, split.optimizer_j * share,
                 round(split.backward_samples * share), round(split.optimizer_samples * share))


def _training_loops(profile: Profile, computes: dict[str, list[Window]]) -> set[str]:
    """The loops whose compute windows lie mostly in timeline buckets where backward or an optimizer ran."""
    tl = profile.timeline
    marked = {i for i, f in enumerate(tl.functions)
              if len(f) >= 2 and (is_backward_frame(str(f[0]), str(f[1])) or is_optimizer_frame(str(f[0]), str(f[1])))}
    spans = sorted((a, b) for a, b, act in zip(tl.start_s, tl.end_s, tl.active) if marked.intersection(act))
    starts = [a for a, _ in spans]
    out = set()
    for n, ws in computes.items():
        time = sum(w.end_s - w.start_s for w in ws)
        beside = 0.0
        for w in ws:  # the buckets are disjoint and in order: those from the one before the window's start on
            for a, b in spans[max(bisect.bisect_right(starts, w.start_s) - 1, 0):]:
                if a >= w.end_s:
                    break
                beside += max(0.0, min(b, w.end_s) - max(a, w.start_s))
        if time > 0 and beside >= TRAINING_EVIDENCE * time:
            out.add(n)
    return out


_SUMMED = ("wait_s", "preprocess_s", "compute_s", "time_s", "wait_j", "preprocess_j", "compute_j", "energy_j",
           "machine_energy_j")


def _saved_timings(fetches: list[Window], rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The tracker's timings as the profile saved them (the facts on each fetch window), when every
    step of a loop with workers has them; else None."""
    facts = {int(f.index): f.loop for f in fetches if f.index is not None and "pipeline_s" in f.loop}
    if not facts or any(r["step"] not in facts for r in rows):
        return None
    return [{"step": r["step"], "epoch": r["epoch"], "wait_s": r["wait_s"], "pipeline_s": facts[r["step"]]["pipeline_s"],
             "preprocess_s": r["preprocess_s"], "compute_s": r["compute_s"],
             "workers": int(facts[r["step"]].get("workers", 0)), "worker": int(facts[r["step"]].get("worker", -1)),
             "startup": bool(facts[r["step"]].get("startup", 0.0))} for r in rows]


def _timings(rows: list[dict[str, Any]], steps: Iterable[Mapping[str, Any]] | None,
             has_workers: bool) -> list[Mapping[str, Any]] | None:
    if steps is not None:
        by_step = {int(s["step"]): s for s in steps}
        # grouped by the profile's epochs (its epoch windows), like the energy beside them
        return [dict(by_step[r["step"]], epoch=r["epoch"]) for r in rows if r["step"] in by_step]
    if has_workers:
        return None
    return [{"step": r["step"], "epoch": r["epoch"], "wait_s": r["wait_s"], "pipeline_s": r["wait_s"],
             "preprocess_s": r["preprocess_s"], "compute_s": r["compute_s"], "workers": 0, "startup": False}
            for r in rows]


def _sum_energy(nodes: list[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in nodes:
        for sid, j in n.energy_j.items():
            out[sid] = out.get(sid, 0.0) + j
    return out
