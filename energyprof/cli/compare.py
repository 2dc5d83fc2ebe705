"""`energyprof compare`: what changed between saved runs, and a gate for CI that knows noise."""

from __future__ import annotations

import sys

from ..setup.options import IDLE_POLICIES
from .common import PROG, Parser, UsageError, add_idle_flag

EXIT_INCONCLUSIVE = 3  # --fail-above: above the limit, but the sides' different loads could explain it


def build_compare_parser() -> Parser:
    p = Parser(prog=f"{PROG} compare",
               description="Compare saved profiles: --base runs against --head runs (repeats of each side give the"
                           " gate its noise), or a plain list, whose first is the baseline and last the head.")
    p.add_argument("profiles", nargs="*", metavar="PROFILE.json", help="two or more profiles saved with --json")
    p.add_argument("--base", nargs="+", metavar="PROFILE.json", help="the baseline's runs (repeats of one program)")
    p.add_argument("--head", nargs="+", metavar="PROFILE.json", help="the compared runs (repeats of one program)")
    p.add_argument("-o", "--output", help="write the comparison as one HTML page")
    p.add_argument("--markdown", metavar="FILE", help="write a short markdown summary (a pull-request comment)")
    p.add_argument("--label", action="append", help="a name for each run, in order, or with --base/--head one per"
                   " side (default: its command line, paths relative to here)")
    p.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit 1 when the head's program CPU-capacity share of the machine's energy (the machine's CPU"
                        " energy, idle included, times the program's CPU time over span x CPUs; with --idle, its energy"
                        " under that policy) is more than PCT percent above the base's with 95%% confidence (Welch's t"
                        " over repeats; one run per side: as measured); exit 3, inconclusive, when it is above but the"
                        " sides' different machine loads could explain it; 0 otherwise, 2 on bad input")
    p.add_argument("--function", metavar="NAME", help="with --fail-above: gate on this function's energy instead")
    p.add_argument("--windows", metavar="NAME", help="place every window named NAME (or NAME:LABEL) of every run as a"
                   " point of energy against time, labelled by LABEL, with the Pareto front marked")
    add_idle_flag(p, None)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p


def side_labels(label: str, runs: int) -> list[str]:
    """One side's label on each of its runs: `fast #1`, `fast #2`, ... (`fast` alone for one run)."""
    return [label] if runs == 1 else [f"{label} #{i + 1}" for i in range(runs)]


def relative_command(meta: dict) -> str:
    """A run's command line with its absolute paths relative to here (or their file name, when
    elsewhere): a label, not a path to copy, and the same on every machine that compares the files."""
    import os

    argv = meta.get("argv") or []
    if not argv:
        return os.path.basename(str(meta.get("target") or "<program>"))
    here = os.getcwd()
    out = []
    for a in (str(x) for x in argv):
        if os.path.isabs(a) and a != os.devnull:
            rel = os.path.relpath(a, here)
            a = rel if not rel.startswith("..") else os.path.basename(a)
        out.append(a)
    return " ".join(out)


def compare_cmd(argv: list[str]) -> int:
    from ..analysis.compare import compare, function_gate
    from ..analysis.pareto import split_name
    from ..analysis.report import RenderOptions
    from ..facts.profile import ProfileFormatError
    from ..facts.profile import load

    ns = build_compare_parser().parse_args(argv)
    if (ns.base is None) != (ns.head is None):
        raise UsageError("--base and --head go together")
    if ns.base is not None and ns.profiles:
        raise UsageError("give profiles either with --base/--head or as a list, not both")
    paths = [*ns.base, *ns.head] if ns.base is not None else ns.profiles
    base_count = len(ns.base) if ns.base is not None else None
    if len(paths) < 2:
        raise UsageError("compare needs at least two profiles")
    labels = ns.label
    if labels and base_count is not None and len(labels) == 2 and len(paths) != 2:
        labels = side_labels(labels[0], base_count) + side_labels(labels[1], len(paths) - base_count)
    if labels and len(labels) != len(paths):
        raise UsageError(f"{len(labels)} --label for {len(paths)} profiles: give one per profile"
                         + (", or one per side" if base_count is not None else ""))
    if ns.function is not None and ns.fail_above is None:
        raise UsageError("--function goes with --fail-above")
    if ns.fail_above is not None and not ns.fail_above >= 0:
        raise UsageError(f"--fail-above must be a percentage >= 0, not {ns.fail_above}")
    try:
        profiles = [load(path) for path in paths]
    except ProfileFormatError as exc:
        raise UsageError(str(exc)) from None
    if ns.idle is not None and ns.idle not in IDLE_POLICIES:
        raise UsageError(f"--idle must be one of {', '.join(IDLE_POLICIES)}, not {ns.idle!r}")
    for path, p in zip(paths, profiles):
        if ns.idle is not None and ns.idle not in p.policies():
            raise UsageError(f"{path} holds figures for idle policy {p.idle_policy!r} only"
                             f" (written by an older energyprof); --idle {ns.idle} needs a new run")
    view = RenderOptions(idle=ns.idle, carbon=None)  # each run's own policy unless --idle says one
    if ns.windows is not None and not any(split_name(w.name)[0] == ns.windows for p in profiles for w in p.windows):
        raise UsageError(f"no window named {ns.windows!r} (or {ns.windows}:LABEL) in the compared profiles")
    cmp = compare(profiles, paths, labels or [relative_command(p.meta) for p in profiles], view, base_count, ns.windows)
    verdict = cmp.verdict
    if ns.function is not None:
        k = base_count or 1
        verdict = function_gate(profiles[:k], profiles[k:] if base_count else profiles[-1:], ns.function, view)
        if verdict is None:
            raise UsageError(f"function {ns.function!r} is in none of the compared profiles")
    from ..render.compare import render_text, verdict_line, write_html, write_markdown

    written = []
    for path, writer in ((ns.output, write_html), (ns.markdown, write_markdown)):
        if path:
            try:
                writer(cmp, path)
            except OSError as exc:
                raise UsageError(f"could not write {path}: {exc.strerror or exc}") from None
            written.append(path)
    if cmp.settings_differ:  # even with -q: a gate that passed or failed for a settings change should say so
        print(f"energyprof: warning: the machine's settings differ between base and head: {cmp.settings_differ[0]}"
              + (f" (and {len(cmp.settings_differ) - 1} more)" if len(cmp.settings_differ) > 1 else ""), file=sys.stderr)
    if not ns.quiet:
        sys.stdout.write(render_text(cmp))
        from ..render.unit_tables import tests_compare_text

        sys.stdout.write(tests_compare_text(profiles[:base_count or 1], profiles[base_count:] if base_count else profiles[-1:]))
        for path in written:
            print(f"energyprof: wrote {path}", file=sys.stderr)
    if ns.fail_above is None or verdict is None:
        return 0
    from ..analysis.compare import FAIL, INCONCLUSIVE

    print(f"energyprof: {verdict_line(verdict, ns.fail_above)}", file=sys.stderr)
    return {FAIL: 1, INCONCLUSIVE: EXIT_INCONCLUSIVE}.get(verdict.outcome(ns.fail_above), 0)
