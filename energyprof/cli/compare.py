"""`energyprof compare A.json B.json`: what changed between saved runs, and a gate for CI."""

from __future__ import annotations

import sys

from ..options import IDLE_POLICIES
from .common import PROG, Parser, UsageError, add_idle_flag


def build_compare_parser() -> Parser:
    p = Parser(prog=f"{PROG} compare", description="Compare saved profiles: the first is the baseline, the last is"
                " compared with it.")
    p.add_argument("profiles", nargs="+", metavar="PROFILE.json", help="two or more profiles saved with --json")
    p.add_argument("-o", "--output", help="write the comparison as one HTML page")
    p.add_argument("--markdown", metavar="FILE", help="write a short markdown summary (a pull-request comment)")
    p.add_argument("--label", action="append", help="a name for each run, in order (default: its command line)")
    p.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit 1 when the last run's program energy is more than PCT percent above the first's")
    p.add_argument("--function", metavar="NAME", help="with --fail-above: gate on this function's energy instead")
    add_idle_flag(p, None)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p


def compare_cmd(argv: list[str]) -> int:
    from ..analysis.compare import compare, function_energy, over_limit
    from ..analysis.report import RenderOptions
    from ..profile import ProfileFormatError, load

    ns = build_compare_parser().parse_args(argv)
    if len(ns.profiles) < 2:
        raise UsageError("compare needs at least two profiles")
    if ns.label and len(ns.label) != len(ns.profiles):
        raise UsageError(f"{len(ns.label)} --label for {len(ns.profiles)} profiles: give one per profile")
    if ns.function is not None and ns.fail_above is None:
        raise UsageError("--function goes with --fail-above")
    if ns.fail_above is not None and not ns.fail_above >= 0:
        raise UsageError(f"--fail-above must be a percentage >= 0, not {ns.fail_above}")
    try:
        profiles = [load(path) for path in ns.profiles]
    except ProfileFormatError as exc:
        raise UsageError(str(exc)) from None
    if ns.idle is not None and ns.idle not in IDLE_POLICIES:
        raise UsageError(f"--idle must be one of {', '.join(IDLE_POLICIES)}, not {ns.idle!r}")
    for path, p in zip(ns.profiles, profiles):
        if ns.idle is not None and ns.idle not in p.policies():
            raise UsageError(f"{path} holds figures for idle policy {p.idle_policy!r} only"
                             f" (written by an older energyprof); --idle {ns.idle} needs a new run")
    view = RenderOptions(idle=ns.idle, carbon=None)  # each run's own policy unless --idle says one
    base = last = None
    if ns.function is not None:
        base, last = (function_energy(profiles[0], ns.function, view),
                      function_energy(profiles[-1], ns.function, view))
        if base is None and last is None:
            raise UsageError(f"function {ns.function!r} is in neither {ns.profiles[0]} nor {ns.profiles[-1]}")
    cmp = compare(profiles, ns.profiles, ns.label, view)
    if ns.function is None:
        base, last = cmp.base.program_total, cmp.last.program_total
    from ..render.compare import render_text, write_html, write_markdown

    written = []
    for path, writer in ((ns.output, write_html), (ns.markdown, write_markdown)):
        if path:
            try:
                writer(cmp, path)
            except OSError as exc:
                raise UsageError(f"could not write {path}: {exc.strerror or exc}") from None
            written.append(path)
    if not ns.quiet:
        sys.stdout.write(render_text(cmp))
        for path in written:
            print(f"energyprof: wrote {path}", file=sys.stderr)
    if ns.fail_above is None:
        return 0
    what = f"function {ns.function}" if ns.function else "program energy"
    change = "appeared" if not base else f"{((last or 0.0) - base) / base * 100:+.1f}%"
    failed = over_limit(ns.fail_above, base, last)
    print(f"energyprof: {what} {change} (limit +{ns.fail_above:g}%): {'FAIL' if failed else 'ok'}", file=sys.stderr)
    return 1 if failed else 0
