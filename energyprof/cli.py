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

from . import __version__
from .options import Options, OptionError

DEFAULT_OUTPUT = "energyprof-report.html"
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
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing of energyprof's own")
    _add_carbon_flags(p)


def _add_carbon_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("carbon and cost")
    g.add_argument("--country", help="ISO 3166 alpha-3 code for the grid's carbon intensity (e.g. FRA)")
    g.add_argument("--region", help="a region within the country, where codecarbon has data (e.g. california)")
    g.add_argument("--cloud", help="PROVIDER:REGION, e.g. gcp:europe-west1")
    g.add_argument("--carbon-intensity", type=float, metavar="G_PER_KWH", help="a fixed intensity in gCO2eq/kWh")
    g.add_argument("--carbon-intensity-trace", metavar="FILE", help="CSV timestamp,g_per_kwh over the run")
    g.add_argument("--pue", type=float, default=None, help="data-centre power usage effectiveness (default 1.0)")
    g.add_argument("--price-per-kwh", type=float, help="electricity price, for cost figures")
    g.add_argument("--currency", default=None, help="currency of --price-per-kwh (default EUR)")


def build_run_parser() -> _Parser:
    p = _Parser(prog=PROG, description="Profile which functions of a Python program spend the energy.",
                usage="%(prog)s [options] script.py [args...] | %(prog)s [options] -m module [args...]"
                      " | %(prog)s report PROFILE.json [-o report.html]")
    p.add_argument("--version", action="version", version=f"energyprof {__version__}")
    _add_output_flags(p)
    p.add_argument("--interval", type=float, default=0.005, help="stack sampling interval in seconds (default 0.005)")
    p.add_argument("--sensor-interval", type=float, default=0.01, help="sensor reading interval in seconds (default 0.01)")
    p.add_argument("--idle", default="share", help="share (default): charge the program its CPU share of the"
                   " machine's energy; all: charge it everything (a dedicated machine)")
    p.add_argument("--sampler", default="threads", help="threads (default, every thread, low overhead) or pyinstrument")
    p.add_argument("--powercap-root", default=None, help="powercap sysfs root (default /sys/class/powercap,"
                   " or $ENERGYPROF_POWERCAP_ROOT)")
    p.add_argument("--power-trace", help="replay this power trace CSV (t_s,<source>...) instead of reading sensors")
    p.add_argument("--cpu-tdp", type=float, help="CPU TDP in watts for the estimate when no counter can be read")
    p.add_argument("--no-gpu", dest="gpus", action="store_false", help="do not read NVIDIA GPUs")
    p.add_argument("--memory", default="rss", help="rss (default, cheap), exact (tracemalloc: slow) or off")
    p.add_argument("--memory-children", action="store_true", help="count child processes' memory in RSS")
    p.add_argument("--no-peak-reset", dest="peak_reset", action="store_false",
                   help="do not reset the kernel's peak-RSS mark (VmHWM) to measure decorated calls' exact peaks")
    p.add_argument("--no-children", dest="children", action="store_false",
                   help="leave child processes out: neither followed nor counted in the program's share")
    p.add_argument("--no-follow", dest="follow", action="store_false",
                   help="do not sample child processes' stacks; they are measured by CPU only")
    p.add_argument("--checkpoint", help="checkpoint file (default: next to the report)")
    p.add_argument("--checkpoint-interval", type=float, default=30.0, help="seconds between checkpoints (default 30)")
    p.add_argument("--sensor-timeout", type=float, default=2.0,
                   help="drop a sensor whose read takes longer than this, in seconds (default 2)")
    p.add_argument("--sync", default=None, help="'cuda': synchronise CUDA at window and function boundaries")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script, like python -m")
    return p


def build_report_parser() -> _Parser:
    p = _Parser(prog=f"{PROG} report", description="Render a saved profile or a checkpoint.")
    p.add_argument("profile", help="a profile JSON (--json) or a checkpoint left by an interrupted run")
    _add_output_flags(p)
    p.add_argument("--idle", default=None, help="idle policy for a checkpoint (default: the run's)")
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


def _options(ns: argparse.Namespace, **extra: Any) -> Options:
    fields = Options.names()
    kwargs = {k: v for k, v in vars(ns).items() if k in fields and v is not None}
    kwargs.update(extra)
    return Options(**kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "report":
            return _report(argv[1:])
        return _run(argv)
    except (UsageError, OptionError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def _report(argv: list[str]) -> int:
    from .checkpoint import load_any

    ns = build_report_parser().parse_args(argv)
    try:
        profile, options_kwargs = load_any(ns.profile, ns.idle)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    output = ns.output or (None if (ns.json or ns.speedscope or ns.folded or ns.csv) else DEFAULT_OUTPUT)
    from . import carbon
    from .outputs import write_outputs
    from .profiler import finish_profile

    # Carbon options: what the run used, overridden by any given now.
    keys = (*carbon.SAVED_OPTIONS, "carbon_intensity_trace")
    given = {k: getattr(ns, k) for k in keys if getattr(ns, k, None) is not None}
    saved = carbon.saved_options(profile)
    if given and {"carbon_intensity", "carbon_intensity_trace", "cloud", "country", "region"} & set(given):
        for k in ("carbon_intensity", "carbon_intensity_trace", "cloud", "country", "region"):
            saved.pop(k, None)  # a new location replaces the old one as a whole
    options = _options(ns, output=output, **{**saved, **given, **options_kwargs})
    if profile.carbon is None or given:
        finish_profile(profile, options)
    write_outputs(profile, options)
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
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {script}: {exc.strerror}") from None
    try:
        compile(source, str(path.resolve()), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise UsageError(f"syntax error in {exc.filename}, line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:
        raise UsageError(f"cannot compile {script}: {exc}") from None


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
    output = ns.output or DEFAULT_OUTPUT
    checkpoint = ns.checkpoint or str(Path(output).with_name(Path(output).stem + ".energyprof-checkpoint.json"))
    # Relative outputs stay relative to the folder energyprof started in: the program's
    # os.chdir happens in its own process.
    options = _options(ns, output=output, checkpoint=checkpoint)
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
    sup = Supervisor(options, command, target, shown, executable=executable)
    try:
        profile, status = sup.run()
    except SpawnError as exc:
        raise UsageError(str(exc)) from None
    try:
        write_outputs(profile, options)
    except OSError:  # already reported, one line each; the program's exit status stays its own
        pass
    if os.WIFSIGNALED(status):
        signals.die_by(os.WTERMSIG(status))
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1
