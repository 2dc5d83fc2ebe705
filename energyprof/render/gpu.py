"""The report's GPU kernels panel: what render/page.py writes (None: no panel)."""

from __future__ import annotations


from ..analysis.gpu import gpu_devices, gpu_functions, gpu_table

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_ROWS = 40


def gpu_panel(model: Any) -> dict[str, Any] | None:
    gpu = gpu_table(model.profile)
    devices = [{"device": d, "source": v.source, "energy_j": v.energy_j, "idle_j": v.idle_j, "busy_s": v.busy_s,
                "update_period_s": v.update_period_s, "short_share": v.short_share}
               for d, v in gpu_devices(model.profile)]
    if gpu is None or not devices:
        return None
    functions = gpu_functions(model.profile)
    # error_j: each function's bar from its tree nodes' (their stacks taken together), analysis/gpu.py
    rows = [{"function": f.function, "file": f.file, "line": f.line, "joules": f.joules, "error_j": f.error_j,
             "busy_s": f.busy_s, "kernels": f.top_kernels()} for f in functions[:MAX_ROWS]]
    sched = gpu.schedule
    schedule = None
    if sched is not None:  # --gpu-kernel-steps: which spans were profiled, and how much energy they held
        schedule = {"windows": len(sched.spans_ns), "profiled_s": sched.profiled_s,
                    "shares": [{"device": d, "percent": 100 * x} for d, x in sorted(sched.profiled_share.items())]}
    return {"devices": devices, "functions": rows, "more": max(0, len(functions) - MAX_ROWS), "schedule": schedule}


CONSOLE_LINES = 8  # launching lines shown per device
LINE_GROUP = "line"  # the console's groups: (LINE_GROUP, label)


def line_group(path: Any) -> tuple[str, str]:
    """The console's group of a launch path (its line), for core/kernels.attribute's `groups`."""
    return (LINE_GROUP, line_label(path))


def gpu_console(att: Any, backward: Any = None) -> str:
    """`gpu-trace`'s console lines: per device its energy, the heaviest launching lines with their
    bars, and [GPU idle]; then what of backward could not be linked. `att`: core/kernels.Attribution,
    made with `line_group` among its groups (else a line's bar is the sum of its stacks');
    `backward`: collect/kernels/kineto.BackwardLinks."""
    from .format import fmt_energy, fmt_percent

    out = ["  GPU energy by launching line (busy time split each power sample; \u00b1 = what the samples a line shares"
           " with others could move, plus the sensor's error):"]
    for dev, d in sorted(att.devices.items()):
        rows: dict[str, list[float]] = {}
        for path, per in att.stacks.items():
            fig = per.get(dev)
            if fig is None:
                continue
            row = rows.setdefault(line_label(path), [0.0, 0.0])
            row[0] += fig.joules
            row[1] += fig.error_j
        for label, row in rows.items():
            together = att.group_error_j.get((LINE_GROUP, label), {}).get(dev)
            if together is not None:
                row[1] = together
        kernels_j = d.total_j - d.idle_j
        out.append(f"    gpu:{dev} {fmt_energy(d.total_j):>9}  kernels {fmt_energy(kernels_j)}"
                   f" ({fmt_percent(kernels_j, d.total_j)}),"
                   f" [GPU idle] {fmt_energy(d.idle_j)} ({fmt_percent(d.idle_j, d.total_j)})")
        shown = sorted(rows.items(), key=lambda kv: -kv[1][0])
        for label, (j, err) in shown[:CONSOLE_LINES]:
            out.append(f"      {fmt_energy(j):>9} \u00b1 {fmt_energy(err):<9} {fmt_percent(j, d.total_j):>6}  {label}")
        if len(shown) > CONSOLE_LINES:
            rest = sum(v[0] for _, v in shown[CONSOLE_LINES:])
            out.append(f"      {fmt_energy(rest):>9}   {'':<9} {fmt_percent(rest, d.total_j):>6}  "
                       f"({len(shown) - CONSOLE_LINES} more lines)")
        out.append(f"      {fmt_energy(d.idle_j):>9} \u00b1 {fmt_energy(d.idle_error_j):<9} "
                   f"{fmt_percent(d.idle_j, d.total_j):>6}  [GPU idle]")
    if backward is not None and backward.records:
        line = (f"  backward: {backward.linked_records} of {backward.records} device records under the forward line"
                " that made them")
        if backward.unlinked_records_total:
            line += "; not linked: " + ", ".join(f"{n} ({r})" for r, n in sorted(backward.unlinked_records.items(),
                                                                                 key=lambda x: -x[1]))
        out.append(line)
    return "\n".join(out) + "\n"


def line_label(path: Any) -> str:
    """A launch path's line: its innermost Python frame (for backward's work, the forward's), else
    its outermost operator; backward's work marked so."""
    from ..core.autograd import BACKWARD_FRAME as backward_frame
    from ..core.kernels import OPERATOR_NODE as operator_node

    path = [tuple(f) for f in path]
    is_backward = tuple(backward_frame) in path
    seg = path[path.index(tuple(backward_frame)) + 1:] if is_backward else path
    frames = [f for f in seg if f[1]]
    if frames:
        fn, file, line = frames[-1]
        label = f"{fn}  {file}:{line}"
    else:
        ops = [f for f in seg if f[0] != operator_node]
        label = ops[0][0] if ops else (path[-1][0] if path else "?")
    return label + ("  (backward)" if is_backward else "")
