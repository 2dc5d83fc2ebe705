"""`energyprof merge A.json B.json -o JOB.json`: join one job's nodes or ranks."""

from __future__ import annotations

import argparse
import sys

from ..setup.options import CARBON_OPTIONS
from .common import PROG, Parser, UsageError, add_idle_flag, build_options


def build_merge_parser() -> Parser:
    p = Parser(prog=f"{PROG} merge", description="Join the profiles of one job (one per node, or one per rank)"
                " into one: a [node HOST] level above the ranks, each node's machine energy counted once.")
    p.add_argument("profiles", nargs="+", metavar="PROFILE.json", help="profiles saved with --json")
    p.add_argument("-o", "--output", dest="json", required=True, metavar="JOB.json", help="the joined profile")
    p.add_argument("--html", help="also render the joined profile as an HTML report")
    p.add_argument("--world-size", type=int, help="ranks the job had (default: what the profiles say);"
                   " a missing rank is named in a note")
    p.add_argument("--hosts", metavar="H1,H2,...", help="the machines the job ran on (a cluster's nodes): any that"
                   " sent no profile is named, here and in the joined profile")
    add_idle_flag(p, None)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing of energyprof's own")
    return p


def merge_cmd(argv: list[str]) -> int:
    from ..core.merge import MergeError, merge
    from ..output.writer import write_outputs
    from ..facts.profile import ProfileFormatError
    from ..facts.profile import load

    ns = build_merge_parser().parse_args(argv)
    if ns.world_size is not None and ns.world_size < 1:
        raise UsageError(f"--world-size must be at least 1, not {ns.world_size}")
    try:
        profiles = [load(path) for path in ns.profiles]
        hosts = [h for h in (ns.hosts or "").split(",") if h.strip()]
        joined = merge(profiles, list(ns.profiles), world_size=ns.world_size, policy=ns.idle, hosts=hosts)
    except (ProfileFormatError, MergeError) as exc:
        raise UsageError(str(exc)) from None
    if not ns.quiet:
        for note in joined.notes:
            if note.kind in ("runs-added", "missing-machine"):  # say so where the figure is made
                print(f"energyprof: {note.message}", file=sys.stderr)
    saved = profiles[0].meta.get("carbon_settings")
    saved = {k: v for k, v in saved.items() if k in CARBON_OPTIONS} if isinstance(saved, dict) else {}
    try:
        options = build_options(argparse.Namespace(), inputs=tuple(ns.profiles), keep_checkpoint=False, json=ns.json,
                           output=ns.html, quiet=ns.quiet, **saved)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        write_outputs(joined, options)
    except OSError:
        return 1
    return 0
