"""`python -m energyprof` / `energyprof`: run a script or module under the profiler.

    energyprof [options] script.py [args...]
    energyprof [options] -m module [args...]
    energyprof report PROFILE.json [-o report.html] [--json ...]

Everything after the script (or module) name belongs to the program. Bad input is one line
on stderr and exit code 2, before the program starts; the program's own output, exception
and exit code pass through untouched.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

from ._version import __version__
from .options import (CARBON_OPTIONS, IDLE_POLICIES, MEMORY_MODES, OUTPUTS, SAMPLERS, Options, OptionError,
                      flag)
from .preflight import preflight

DEFAULT_OUTPUT = "energyprof-report.html"
DEFAULT_JOB_JSON = "energyprof-profile.json"  # one rank of several: the job's profile, joined by rank 0
PROG = "energyprof"


class UsageError(Exception):
    """A bad command line: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + line
        raise UsageError(message)


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", help=f"HTML report path (default {DEFAULT_OUTPUT})")
    p.add_argument("--json", help="save the profile as JSON (docs/profile-format.md)")
    p.add_argument("--speedscope", help="export for speedscope (one profile by energy, one by time)")
    p.add_argument("--folded", help="export folded stacks 'a;b;c <microjoules>' for flamegraph tools")
    p.add_argument("--csv", help="export one row per function")
    p.add_argument("--pprof", help="export gzipped pprof (energy_<source> in uJ, cpu and wall in ns) for pprof/Pyroscope/Parca")
    p.add_argument("--mlflow", action="store_true",
                   help="log to the active MLflow run, or a new one (pip install 'energyprof[mlflow]')")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing of energyprof's own")
    _add_carbon_flags(p)


def _add_carbon_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("carbon and cost (render options: `energyprof report` can change them)")
    g.add_argument("--country", help="ISO 3166 alpha-3 code for the grid's carbon intensity (e.g. FRA)")
    g.add_argument("--region", help="a region within the country, where codecarbon has data (e.g. california)")
    g.add_argument("--cloud", help="PROVIDER:REGION, e.g. gcp:europe-west1")
    g.add_argument("--carbon-intensity", type=float, metavar="G_PER_KWH",
                   help="a fixed intensity in gCO2eq/kWh (0 to 2000)")
    g.add_argument("--carbon-intensity-trace", metavar="FILE", help="CSV timestamp,g_per_kwh over the run")
    g.add_argument("--pue", type=float, default=None, help="data-centre power usage effectiveness, 1 to 5 (default 1.0)")
    g.add_argument("--price-per-kwh", type=float, help="electricity price per kWh, for cost figures")
    g.add_argument("--currency", default=None, help="currency of --price-per-kwh (default EUR)")


RUN_EPILOG = """energyprof's options come before the script (or -m module, or --): everything after it is the
program's own arguments, passed untouched.

subcommands:
  report PROFILE.json   render a saved profile or a checkpoint again (HTML, JSON, exports), with
                        other render options (--idle, --country, --price-per-kwh, ...);
                        see `energyprof report --help`
  merge PROFILE.json... join the profiles of one job's nodes or ranks into one (-o job.json,
                        --html job.html); see `energyprof merge --help` and docs/distributed.md"""


def build_run_parser() -> _Parser:
    p = _Parser(prog=PROG, description="Profile which functions of a Python program spend the energy.",
                usage="%(prog)s [options] script.py [args...] | %(prog)s [options] -m module [args...]"
                      " | %(prog)s report PROFILE.json [options] | %(prog)s merge PROFILE.json... -o JOB.json",
                epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"energyprof {__version__}")
    _add_output_flags(p)
    p.add_argument("--interval", type=float, default=0.005,
                   help="stack sampling interval in seconds, 0.0005 to 60 (default 0.005)")
    p.add_argument("--sensor-interval", type=float, default=0.01,
                   help="sensor reading interval in seconds, up to 60 (default 0.01)")
    _add_idle_flag(p, "share")
    p.add_argument("--sampler", default="threads", metavar=_allowed(SAMPLERS),
                   help="threads (default, every thread, low overhead) or pyinstrument")
    p.add_argument("--powercap-root", default=None, help="powercap sysfs root (default /sys/class/powercap,"
                   " or $ENERGYPROF_POWERCAP_ROOT)")
    p.add_argument("--power-trace", help="replay this power trace CSV (t_s,<source>...) instead of reading sensors")
    p.add_argument("--cpu-tdp", type=float, help="CPU TDP in watts (up to 2000) for the estimate when no counter"
                   " can be read")
    p.add_argument("--no-gpu", dest="gpus", action="store_false", help="do not read NVIDIA GPUs")
    p.add_argument("--memory", default="rss", metavar=_allowed(MEMORY_MODES),
                   help="rss (default, cheap), exact (tracemalloc: slow) or off")
    p.add_argument("--memory-children", action="store_true", help="count child processes' memory in RSS")
    p.add_argument("--no-peak-reset", dest="peak_reset", action="store_false",
                   help="do not reset the kernel's peak-RSS mark (VmHWM) to measure decorated calls' exact peaks")
    p.add_argument("--no-children", dest="children", action="store_false",
                   help="leave child processes out: neither followed nor counted in the program's share")
    p.add_argument("--no-follow", dest="follow", action="store_false",
                   help="do not sample child processes' stacks; they are measured by CPU only")
    p.add_argument("--checkpoint", help="checkpoint file (default: next to the report); an earlier run's"
                   " checkpoint found there is kept under a new name")
    p.add_argument("--checkpoint-interval", type=float, default=30.0,
                   help="seconds between checkpoints, up to 86400 (default 30)")
    p.add_argument("--sensor-timeout", type=float, default=2.0,
                   help="drop a sensor whose read takes longer than this, in seconds, up to 3600 (default 2)")
    p.add_argument("--sync", default=None, metavar="{cuda}",
                   help="'cuda': synchronise CUDA at window and function boundaries")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script, like python -m")
    return p


def _allowed(values: tuple[str, ...]) -> str:
    """The allowed values, shown in --help; Options checks them with its own one-line message."""
    return "{" + ",".join(values) + "}"


def _add_idle_flag(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("--idle", default=default, metavar=_allowed(IDLE_POLICIES),
                   help="share: charge the program its CPU share of the machine's energy; all: charge it"
                        " everything (a dedicated machine)" + ("" if default else
                                                                "; default: the policy the run used"))


def build_report_parser() -> _Parser:
    p = _Parser(prog=f"{PROG} report", description="Render a saved profile or a checkpoint again: the idle policy,"
                " carbon and cost are render options, so any of them can change here.")
    p.add_argument("profile", help="a profile JSON (--json) or a checkpoint left by an interrupted run")
    _add_output_flags(p)
    _add_idle_flag(p, None)
    return p


def split_argv(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], str | None, str | None, list[str]]:
    """(energyprof's flags, script, module, the program's args): the program's args are never parsed."""
    takes_value = {opt for a in parser._actions for opt in a.option_strings if a.nargs != 0}
    i = 0
    argv = list(argv)
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            if i + 1 >= len(argv):
                break
            return argv[:i], argv[i + 1], None, argv[i + 2:]
        if tok == "-m":
            if i + 1 >= len(argv):
                raise UsageError("-m needs a module name")
            return argv[:i], None, argv[i + 1], argv[i + 2:]
        if tok.startswith("-m") and not tok.startswith("--") and len(tok) > 2:
            return argv[:i], None, tok[2:], argv[i + 1:]
        if tok.startswith("-") and tok != "-":
            if "=" not in tok and tok in takes_value:
                i += 1
            i += 1
            continue
        return argv[:i], tok, None, argv[i + 1:]
    return argv, None, None, []


def _options(ns: argparse.Namespace, inputs: tuple[str, ...] = (), keep_checkpoint: bool = True,
             **extra: Any) -> Options:
    """Options from parsed flags, validated (pure) and then checked against the file system."""
    fields = Options.names()
    kwargs = {k: v for k, v in vars(ns).items() if k in fields and v is not None}
    for name in ("output", *OUTPUTS, "checkpoint"):
        if kwargs.get(name) == "":
            raise OptionError(f"{flag(name)} needs a file name, not ''")
    kwargs.update(extra)
    options = Options(**kwargs)
    preflight(options, inputs=inputs, keep_checkpoint=keep_checkpoint)
    return options


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "report":
            return _report(argv[1:])
        if argv and argv[0] == "compare":
            return _compare(argv[1:])
        if argv and argv[0] == "merge":
            return _merge(argv[1:])
        return _run(argv)
    except (UsageError, OptionError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def _report(argv: list[str]) -> int:
    """Render a saved profile (or a checkpoint) with these render options; nothing in it is edited."""
    from .checkpoint import load_any
    from .outputs import render_options, write_outputs
    from .profile import ProfileFormatError

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
        options = _options(ns, inputs=(ns.profile,), keep_checkpoint=False, output=output, **{**saved, **given})
        render = render_options(options, idle=idle)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        write_outputs(profile, options, render=render)
    except OSError:
        return 1  # each failure was one line already
    return 0


def _check_target(script: str | None, module: str | None) -> None:
    """Refuse, before anything runs, a program that cannot start."""
    if script is None and module is None:
        raise UsageError("no script given: energyprof [options] script.py [args...] (or -m module)")
    if module is not None:
        _check_module(module)
        return
    assert script is not None
    path = Path(script)
    if not path.exists():
        raise UsageError(f"script not found: {script}")
    if path.is_dir():
        if (path / "__main__.py").is_file():
            path = path / "__main__.py"
        else:
            raise UsageError(f"{script} is a directory, not a script")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read {script}: permission denied")
    # A SyntaxError is the program's own: Python prints its traceback and exits 1, as alone.


def _check_module(module: str) -> None:
    """Find the module as `python -m` will (the current folder first) without importing
    anything: a package's `__init__` is the program's code, not energyprof's to run."""
    import importlib.machinery
    import importlib.util

    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        raise UsageError(f"no module named {module!r}")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd()])
    if spec is None:
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError) as exc:
            raise UsageError(f"cannot find module {module!r}: {exc}") from None
    for depth in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            break
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]),
                                                        list(spec.submodule_search_locations))
    if spec is None:
        raise UsageError(f"no module named {module!r}")


def _check_command(command: str) -> str | None:
    """The executable a `-- COMMAND` runs (None: looked up on PATH when it starts)."""
    import shutil

    if os.sep in command:
        if not (os.path.isfile(command) and os.access(command, os.X_OK)):
            raise UsageError(f"cannot run {command}: not an executable file")
        return command
    if shutil.which(command) is None:
        raise UsageError(f"command not found: {command}")
    return None


def _interpreter_flags() -> list[str]:
    """The interpreter's own flags (-X dev, -W error, -O, ...) for the program's python, but
    those that would keep the sampler's bootstrap from starting (-I, -E, -S)."""
    import subprocess

    return [f for f in subprocess._args_from_interpreter_flags() if f not in ("-I", "-E", "-S")]


def _run(argv: list[str]) -> int:
    parser = build_run_parser()
    own, script, module, prog_args = split_argv(parser, argv)
    ns = parser.parse_args(own)
    command_form = script is not None and len(own) < len(argv) and argv[len(own)] == "--"
    from . import distributed

    rank = distributed.rank_info(os.environ, command_form)
    values = distributed.placeholder_values(os.environ, rank, os.getpid())
    job: dict[str, str] = {}
    if rank is not None:
        # One rank of several: every output is the rank's own, and rank 0 writes the job's
        # under the names given (or the defaults) once the ranks are joined.
        job = {"output": ns.output or DEFAULT_OUTPUT, "json": ns.json or DEFAULT_JOB_JSON}
        ns.output, ns.json = distributed.per_rank(job["output"]), distributed.per_rank(job["json"])
        for name in ("speedscope", "folded", "csv", "pprof", "checkpoint"):
            if getattr(ns, name):
                setattr(ns, name, distributed.per_rank(getattr(ns, name)))
    rank_json = ns.json
    for name in ("output", *OUTPUTS, "checkpoint"):
        if getattr(ns, name, None):
            setattr(ns, name, distributed.expand(getattr(ns, name), values))
    output = ns.output or DEFAULT_OUTPUT
    checkpoint = ns.checkpoint or str(Path(output).with_name(Path(output).stem + ".energyprof-checkpoint.json"))
    # Relative outputs stay relative to the folder energyprof started in: the program's
    # os.chdir happens in its own process.
    options = _options(ns, output=output, checkpoint=checkpoint)
    if rank is not None and rank.rank == 0:
        from .preflight import check_writable

        for name, path in job.items():  # the job's outputs, written by rank 0 at the end
            check_writable(distributed.expand(distributed.job_name(path), values), flag(name))
    executable: str | None = sys.executable
    if command_form:
        assert script is not None
        executable = _check_command(script)
        command, target = [script, *prog_args], script
    else:
        _check_target(script, module)
        python = [sys.executable, *_interpreter_flags()]
        if module is not None:
            command, target = [*python, "-m", module, *prog_args], module
        else:
            assert script is not None
            command, target = [*python, script, *prog_args], script
    from .outputs import write_outputs
    from .supervise import signals
    from .supervise.supervisor import SpawnError, Supervisor

    launcher = sys.argv[0] if sys.argv else PROG
    shown = ["python -m energyprof" if launcher.endswith("__main__.py") else os.path.basename(launcher), *argv]
    reader = distributed.NodeReader(os.path.dirname(options.json or output), rank) if rank is not None else None
    meta = {"distributed": rank.to_meta(reader.elected)} if rank is not None and reader is not None else None
    sup = Supervisor(options, command, target, shown, executable=executable, meta=meta)
    try:
        profile, status = sup.run()
    except SpawnError as exc:
        raise UsageError(str(exc)) from None
    store = None
    if rank is not None and rank_json is not None:
        store = distributed.job_store(os.environ, distributed.gather_timeout(os.environ))
        if store is not None and rank.rank != 0:  # before the files: rank 0 may be waiting
            distributed.publish(store, rank, profile.to_json())
    try:
        write_outputs(profile, options)
    except OSError:  # already reported, one line each; the program's exit status stays its own
        pass
    if reader is not None:
        reader.release()
    if rank is not None and rank.rank == 0 and rank_json is not None:
        _write_job(profile, options, rank, rank_json, values, job, sup.started_wall, store)
    if os.WIFSIGNALED(status):
        signals.die_by(os.WTERMSIG(status))
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


# ---------------------------------------------------------------- compare


def build_compare_parser() -> _Parser:
    p = _Parser(prog=f"{PROG} compare", description="Compare saved profiles: the first is the baseline, the last is"
                " compared with it.")
    p.add_argument("profiles", nargs="+", metavar="PROFILE.json", help="two or more profiles saved with --json")
    p.add_argument("-o", "--output", help="write the comparison as one HTML page")
    p.add_argument("--markdown", metavar="FILE", help="write a short markdown summary (a pull-request comment)")
    p.add_argument("--label", action="append", help="a name for each run, in order (default: its command line)")
    p.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit 1 when the last run's program energy is more than PCT percent above the first's")
    p.add_argument("--function", metavar="NAME", help="with --fail-above: gate on this function's energy instead")
    _add_idle_flag(p, None)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p


def _compare(argv: list[str]) -> int:
    from .analysis.compare import compare, function_energy, over_limit
    from .analysis.report import RenderOptions
    from .profile import ProfileFormatError, load

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
    from .render.compare import render_text, write_html, write_markdown

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


def _write_job(profile: Any, options: Options, rank: Any, rank_json: str, values: dict[str, str],
               job: dict[str, str], started_wall: float, store: Any) -> None:
    """Rank 0, its own outputs written: the other ranks' profiles (through the job's store, or
    from the shared output folder, a bounded wait for those still writing), joined into the
    job's profile and report."""
    import dataclasses

    from . import distributed
    from .core.merge import MergeError, merge
    from .outputs import write_outputs

    others = distributed.gather(rank_json, values, rank, started_wall, distributed.gather_timeout(os.environ), store)
    ranks = [profile, *(others[r][0] for r in sorted(others))]
    labels = [f"rank {p.meta['distributed']['rank']}" for p in ranks]
    try:
        joined = merge(ranks, labels, world_size=rank.world_size)
    except MergeError as exc:
        print(f"energyprof: could not join the ranks' profiles: {exc}", file=sys.stderr)
        return
    joined.meta["distributed"]["gathered"] = {str(r): how for r, (_, how) in sorted(others.items())}
    paths = {k: distributed.expand(distributed.job_name(v), values) for k, v in job.items()}
    job_options = dataclasses.replace(options, output=paths["output"], json=paths["json"], speedscope=None,
                                      folded=None, csv=None, pprof=None, mlflow=False, checkpoint=None)
    try:
        write_outputs(joined, job_options)
    except OSError:
        pass


# ---------------------------------------------------------------- merge


def build_merge_parser() -> _Parser:
    p = _Parser(prog=f"{PROG} merge", description="Join the profiles of one job (one per node, or one per rank)"
                " into one: a [node HOST] level above the ranks, each node's machine energy counted once.")
    p.add_argument("profiles", nargs="+", metavar="PROFILE.json", help="profiles saved with --json")
    p.add_argument("-o", "--output", dest="json", required=True, metavar="JOB.json", help="the joined profile")
    p.add_argument("--html", help="also render the joined profile as an HTML report")
    p.add_argument("--world-size", type=int, help="ranks the job had (default: what the profiles say);"
                   " a missing rank is named in a note")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing of energyprof's own")
    return p


def _merge(argv: list[str]) -> int:
    from .core.merge import MergeError, merge
    from .outputs import write_outputs
    from .profile import ProfileFormatError, load

    ns = build_merge_parser().parse_args(argv)
    if ns.world_size is not None and ns.world_size < 1:
        raise UsageError(f"--world-size must be at least 1, not {ns.world_size}")
    try:
        profiles = [load(path) for path in ns.profiles]
        joined = merge(profiles, list(ns.profiles), world_size=ns.world_size)
    except (ProfileFormatError, MergeError) as exc:
        raise UsageError(str(exc)) from None
    saved = profiles[0].meta.get("carbon_settings")
    saved = {k: v for k, v in saved.items() if k in CARBON_OPTIONS} if isinstance(saved, dict) else {}
    try:
        options = _options(argparse.Namespace(), inputs=tuple(ns.profiles), keep_checkpoint=False, json=ns.json,
                           output=ns.html, quiet=ns.quiet, **saved)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        write_outputs(joined, options)
    except OSError:
        return 1
    return 0
