"""`energyprof report PROFILE.json`: render a saved profile or a checkpoint again."""

from __future__ import annotations

from ..setup.options import CARBON_OPTIONS
from ..setup.options import OUTPUTS
from .common import DEFAULT_OUTPUT, PROG, Parser, UsageError, add_idle_flag, add_output_flags, build_options


def build_report_parser() -> Parser:
    p = Parser(prog=f"{PROG} report", description="Render a saved profile or a checkpoint again: the idle policy,"
                " carbon and cost are render options, so any of them can change here.")
    p.add_argument("profile", help="a profile JSON (--json) or a checkpoint left by an interrupted run")
    add_output_flags(p)
    add_idle_flag(p, None)
    return p


def report(argv: list[str]) -> int:
    """Render a saved profile (or a checkpoint) with these render options; nothing in it is edited."""
    from ..collect.checkpoint import load_any
    from ..output.writer import render_options
    from ..output.writer import write_outputs
    from ..facts.profile import ProfileFormatError

    ns = build_report_parser().parse_args(argv)
    try:
        profile = load_any(ns.profile)
    except ProfileFormatError as exc:
        raise UsageError(str(exc)) from None
    if ns.idle is not None and ns.idle not in profile.policies():
        raise UsageError(f"{ns.profile} holds figures for idle policy {profile.idle_policy!r} only"
                         f" (written by an older energyprof); --idle {ns.idle} needs a new run")
    others = [getattr(ns, name, None) for name in OUTPUTS if name != "output"]
    output = ns.output if ns.output is not None or any(others) \
        else DEFAULT_OUTPUT
    # Carbon and cost: what the run asked for, replaced by any location given now.
    saved = profile.meta.get("carbon_settings")
    saved = {k: v for k, v in saved.items() if k in CARBON_OPTIONS} if isinstance(saved, dict) else {}
    given = {k: getattr(ns, k) for k in (*CARBON_OPTIONS, "carbon_intensity_trace") if getattr(ns, k) is not None}
    if {"carbon_intensity", "carbon_intensity_trace", "cloud", "country", "region"} & set(given):
        for k in ("carbon_intensity", "cloud", "country", "region"):
            saved.pop(k, None)  # a new location replaces the old one as a whole
    idle, ns.idle = ns.idle, None  # a render option here, not a run option
    try:
        options = build_options(ns, inputs=(ns.profile,), keep_checkpoint=False, output=output, **{**saved, **given})
        render = render_options(options, idle=idle)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        write_outputs(profile, options, render=render)
    except OSError:
        return 1  # each failure was one line already
    return 0
