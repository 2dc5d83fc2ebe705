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
import builtins
import importlib.util
import os
import signal
import sys
import traceback
import types
from pathlib import Path
from typing import Any, NoReturn, Sequence

from . import __version__
from .options import (CARBON_OPTIONS, IDLE_POLICIES, MEMORY_MODES, OUTPUTS, SAMPLERS, Options, OptionError,
                      flag)
from .preflight import preflight

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
                        see `energyprof report --help`"""


def build_run_parser() -> _Parser:
    p = _Parser(prog=PROG, description="Profile which functions of a Python program spend the energy.",
                usage="%(prog)s [options] script.py [args...] | %(prog)s [options] -m module [args...]"
                      " | %(prog)s report PROFILE.json [options]",
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
                   help="do not count child processes' CPU time in the program's share")
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
    output = ns.output if ns.output is not None or (ns.json or ns.speedscope or ns.folded or ns.csv) \
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


def _check_target(script: str | None, module: str | None) -> types.CodeType | None:
    if script is None and module is None:
        raise UsageError("no script given: energyprof [options] script.py [args...] (or -m module)")
    if module is not None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise UsageError(f"cannot find module {module!r}: {exc}") from None
        if spec is None:
            raise UsageError(f"no module named {module!r}")
        return None
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
        return compile(source, str(path.resolve()), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise UsageError(f"syntax error in {exc.filename}, line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:
        raise UsageError(f"cannot compile {script}: {exc}") from None


def _run(argv: list[str]) -> int:
    parser = build_run_parser()
    own, script, module, prog_args = split_argv(parser, argv)
    ns = parser.parse_args(own)
    output = ns.output or DEFAULT_OUTPUT
    checkpoint = ns.checkpoint or str(Path(output).with_name(Path(output).stem + ".energyprof-checkpoint.json"))
    options = _options(ns, output=output, checkpoint=checkpoint)
    code = _check_target(script, module)

    from .outputs import write_outputs
    from .profiler import Profiler

    target = module if module is not None else script
    prof = Profiler(options)
    launcher = sys.argv[0] if sys.argv else PROG
    prof.argv = ["python -m energyprof" if launcher.endswith("__main__.py") else os.path.basename(launcher), *argv]
    exit_code = 0
    status: dict[str, Any] = {"status": "completed"}
    pending: BaseException | None = None
    term = _SigtermGuard()
    prof.start(target=target)
    try:
        with term:
            if module is not None:
                _exec_module(module, prog_args)
            else:
                assert code is not None and script is not None
                _exec_script(code, script, prog_args)
    except SystemExit as exc:
        exit_code, status = _exit_code(exc), {"status": "exit", "code": _exit_code(exc)}
        pending = exc
    except KeyboardInterrupt as exc:
        exit_code, status = 130, {"status": "interrupted", "exception": "KeyboardInterrupt"}
        pending = exc
    except BaseException as exc:  # noqa: BLE001 - the program's, reported as Python would
        exit_code, status = 1, {"status": "exception", "exception": f"{type(exc).__name__}: {exc}"}
        pending = exc
    if term.fired:
        status = {"status": "terminated", "signal": "SIGTERM"}
    profile = prof.stop(status)
    try:
        write_outputs(profile, options)
    except OSError:  # already reported, one line each; the program's exit code stays its own
        pass
    if pending is not None:
        _report_exit(pending)
    if term.fired:
        term.die()
    return exit_code


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    return 1


def _report_exit(exc: BaseException) -> None:
    """Print what Python itself would have printed for this ending."""
    if isinstance(exc, SystemExit):
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        return
    tb = exc.__traceback__
    from .stacks.frames import is_machinery

    while tb is not None and is_machinery(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)
    sys.stderr.flush()


def _fresh_main(name: str, file: str | None) -> types.ModuleType:
    mod = types.ModuleType("__main__")
    mod.__dict__.update({"__file__": file, "__builtins__": builtins, "__cached__": None,
                         "__loader__": None, "__spec__": None, "__package__": None})
    sys.modules["__main__"] = mod
    return mod


def _exec_script(code: types.CodeType, script: str, args: list[str]) -> None:
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    mod = _fresh_main("__main__", os.path.abspath(script))
    exec(code, mod.__dict__)


def _exec_module(module: str, args: list[str]) -> None:
    import runpy

    sys.argv = [module, *args]
    sys.path[0] = os.getcwd()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class _SigtermGuard:
    """Turn SIGTERM into an orderly stop so the outputs are written, then die by SIGTERM.

    Only when the program has not installed a SIGTERM handler of its own, in which case
    that handler runs untouched; energyprof then just reports whatever ending follows.
    """

    def __init__(self) -> None:
        self.fired = False
        self._previous: Any = None

    def __enter__(self) -> _SigtermGuard:
        if hasattr(signal, "SIGTERM"):
            try:
                self._previous = signal.signal(signal.SIGTERM, self._handler)
            except ValueError:  # not the main thread
                self._previous = None
        return self

    def _handler(self, signum: int, frame: Any) -> None:
        self.fired = True
        raise _Terminated()

    def __exit__(self, *exc: Any) -> bool:
        if hasattr(signal, "SIGTERM"):
            try:
                if signal.getsignal(signal.SIGTERM) == self._handler:
                    signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            except ValueError:
                pass
        return bool(exc and exc[0] is _Terminated)

    def die(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


class _Terminated(BaseException):
    pass


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
