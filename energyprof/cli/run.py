"""`energyprof [options] script.py | -m module | -- COMMAND`: run the program under the supervisor.

Everything after the script (or module) name belongs to the program. Bad input is one line
on stderr and exit code 2, before the program starts; the program's own output, exception
and exit code pass through untouched.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import TYPE_CHECKING, Any, Sequence

from .._version import __version__
from ..record import field, record
from ..setup.choices import DEFAULT_INTERVAL
from ..setup.choices import DEFAULT_SENSOR_INTERVAL
from ..setup.choices import IO_MODES
from ..setup.choices import MEMORY_MODES
from ..setup.choices import OUTPUTS
from ..setup.choices import SAMPLERS
from ..setup.choices import SENSORS
from ..setup.choices import flag
from .common import (DEFAULT_JOB_JSON, DEFAULT_OUTPUT, PROG, Parser, UsageError, add_idle_flag, add_output_flags,
                     allowed, build_options)

if TYPE_CHECKING:
    from ..setup.options import Options


RUN_EPILOG = """energyprof's options come before the script (or -m module, or --): everything after it is the
program's own arguments, passed untouched.

subcommands:
  report PROFILE.json   render a saved profile or a checkpoint again (HTML, JSON, exports), with
                        other render options (--idle, --country, --price-per-kwh, ...);
                        see `energyprof report --help`
  compare --base A.json... --head B.json...
                        what changed between runs, with each side's repeats as its noise;
                        --fail-above PCT gates CI, -o a page, --windows NAME a Pareto front;
                        see `energyprof compare --help` and docs/experiments.md
  merge PROFILE.json... join the profiles of one job's nodes or ranks into one (-o job.json,
                        --html job.html); see `energyprof merge --help` and docs/distributed.md
  sweep --grid N=A,B --knob KIND=LOW:HIGH:STEP -- COMMAND {N}
                        run a program over a grid of arguments x power knobs, repeated; each
                        configuration's energy and time, the best one and the Pareto front;
                        see `energyprof sweep --help` and docs/knobs.md
  sensors               what this machine can measure and how to enable what is missing;
                        `sensors record` saves a power trace; see `energyprof sensors --help`
  gpu-trace TRACE.json[.gz] --power-trace POWER.csv
                        a saved PyTorch profiler trace's GPU energy on the lines that launched
                        its kernels (--json, -o); see `energyprof gpu-trace --help` and docs/gpu.md
  estimate fit PROFILE.json... -o MODEL.json | estimate predict MODEL.json --flops F ...
                        a training run's energy before it runs, from a model fitted on saved
                        profiles; see `energyprof estimate --help` and docs/experiments.md"""


def build_run_parser() -> Parser:
    p = Parser(prog=PROG, description="Profile which functions of a Python program spend the energy.",
                usage="%(prog)s [options] script.py [args...] | %(prog)s [options] -m module [args...]"
                      " | %(prog)s report PROFILE.json [options] | %(prog)s compare --base A.json --head B.json"
                      " | %(prog)s merge PROFILE.json... -o JOB.json | %(prog)s sensors"
                      " | %(prog)s gpu-trace TRACE.json --power-trace POWER.csv",
                epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"energyprof {__version__}")
    add_output_flags(p)
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                   help=f"stack sampling interval in seconds, 0.0005 to 60 (default {DEFAULT_INTERVAL:g})")
    p.add_argument("--sensor-interval", type=float, default=DEFAULT_SENSOR_INTERVAL,
                   help=f"sensor reading interval in seconds, up to 60 (default {DEFAULT_SENSOR_INTERVAL:g})")
    add_idle_flag(p, "share")
    p.add_argument("--sampler", default="threads", metavar=allowed(SAMPLERS),
                   help="threads (default, every thread, low overhead) or pyinstrument")
    p.add_argument("--powercap-root", default=None, help="powercap sysfs root (default /sys/class/powercap,"
                   " or $ENERGYPROF_POWERCAP_ROOT)")
    p.add_argument("--power-trace", help="replay this power trace CSV (t_s,<source>...) instead of reading sensors")
    p.add_argument("--cpu-tdp", type=float, help="CPU TDP in watts (up to 2000) for the estimate when no counter"
                   " can be read")
    p.add_argument("--no-gpu", dest="gpus", action="store_false", help="do not read NVIDIA GPUs")
    p.add_argument("--sensor", action="append", metavar="NAME",
                   help="read only this sensor backend (repeatable), even off its usual platform: "
                        + ", ".join(SENSORS) + "; `energyprof sensors` lists what this machine has")
    p.add_argument("--memory", default="rss", metavar=allowed(MEMORY_MODES),
                   help="rss (default, cheap), exact (tracemalloc: slow) or off")
    p.add_argument("--memory-children", action="store_true", help="count child processes' memory in RSS")
    p.add_argument("--io", default="on", metavar=allowed(IO_MODES),
                   help="on (default): the program's and the disks' I/O counters, at each tick and window edge;"
                        " off: none read")
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
    p.add_argument("--gpu-kernels", dest="gpu_kernels", action="store_const", const=True, default=None,
                   help="run the PyTorch profiler in the program and put each GPU kernel's energy on the line that"
                        " launched it (needs torch and a GPU; docs/gpu.md); without this flag it runs on a few steps"
                        " in every 100 when the program uses CUDA through PyTorch")
    p.add_argument("--no-gpu-kernels", dest="gpu_kernels", action="store_const", const=False,
                   help="never run the PyTorch profiler: GPU energy by wall time on the sampled stacks")
    p.add_argument("--gpu-kernel-trace", metavar="DIR",
                   help="with --gpu-kernels: also write each profiler cycle's Chrome trace into DIR (gzipped)")
    p.add_argument("--gpu-kernel-steps", metavar="EVERY:ACTIVE[:WINDOWS]",
                   help="with --gpu-kernels: profile only ACTIVE steps of every EVERY (steps marked by"
                        " energyprof.torch.track), at most WINDOWS windows; the rest stays on the wall-time rule")
    p.add_argument("--expect-epochs", type=int, metavar="N",
                   help="the passes each energyprof.torch.track() loop will make (unless the program gives"
                        " track(epochs=N)): after each, a forecast of the run's energy, time and carbon on stderr,"
                        " kept in the profile; an energyprof flag, before the script, apart from the script's own --epochs")
    p.add_argument("--knob", action="append", metavar="KIND[:INDEX]=VALUE",
                   help="set a power knob for this run and put it back after (gpu_power_limit=W, cpu_power_limit=W,"
                        " cpu_max_freq=kHz, jetson_power_mode=N); repeatable; see docs/knobs.md")
    p.add_argument("--watch-cache", metavar="PATH", help="measure the page-cache residency of the files under PATH"
                   " at the run's start and end and at each energyprof.torch.track() pass's start and end, and record the"
                   " storage device behind it")
    p.add_argument("--influx", metavar="URL",
                   help="send power and energy per source each second, each window and the carbon to InfluxDB while the"
                        " program runs: http://HOST:8086/DB (1.x), or http://HOST:8086?org=ORG&bucket=B with $INFLUX_TOKEN (2.x)")
    p.add_argument("--pushgateway", metavar="URL",
                   help="push the same figures to a Prometheus pushgateway (http://HOST:9091) while the program runs")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script, like python -m")
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


def _check_target(script: str | None, module: str | None) -> None:
    """Refuse, before anything runs, a program that cannot start."""
    if script is None and module is None:
        raise UsageError("no script given: energyprof [options] script.py [args...] (or -m module)")
    if module is not None:
        _check_module(module)
        return
    assert script is not None
    path = script or "."  # as pathlib reads an empty name
    if not os.path.exists(path):
        raise UsageError(f"script not found: {script}")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "__main__.py")):
            path = os.path.join(path, "__main__.py")
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


_PY_TAKES_VALUE = set("cmWX")  # python's one-letter options that take a value
_PY_LONG_WITH_VALUE = ("--check-hash-based-pycs",)


def _interpreter_flags(orig_argv: Sequence[str] | None = None) -> list[str]:
    """The interpreter options the user gave energyprof's python (`python -u -X dev -W error -m
    energyprof ...`), as given, for the program's python.

    Read from `sys.orig_argv` (what `subprocess._args_from_interpreter_flags` rebuilds from
    `sys.flags` misses -u and most -X options), up to `-m energyprof` or the script that is
    energyprof. -I, -E and -S would keep the sampler's bootstrap from starting: -I becomes -s -P
    (no user site, no unsafe path), the others are dropped. -i is refused (UsageError).
    """
    argv = list(sys.orig_argv if orig_argv is None else orig_argv)[1:]
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "-" or not tok.startswith("-") or tok == "--":
            break  # the script that is energyprof (its console script), or stdin
        if tok.startswith("--"):
            name = tok.split("=", 1)[0]
            if name in _PY_LONG_WITH_VALUE:
                out.append(tok)
                if "=" not in tok and i + 1 < len(argv):
                    out.append(argv[i + 1])
                    i += 1
            i += 1
            continue
        j = 1
        while j < len(tok):
            letter = tok[j]
            if letter in _PY_TAKES_VALUE:
                value = tok[j + 1:]
                if not value and i + 1 < len(argv):
                    i += 1
                    value = argv[i]
                if letter in "cm":  # `-m energyprof`: energyprof's own arguments follow
                    return out
                out.extend([f"-{letter}", value])
                break
            if letter == "i":
                raise UsageError("-i (inspect after the program) cannot be used with energyprof:"
                                 " run python -i without it")
            if letter == "I":
                out.extend(["-s", "-P"] if sys.version_info >= (3, 11) else ["-s"])
            elif letter not in "ES":
                out.append(f"-{letter}")
            j += 1
        i += 1
    return out


def default_checkpoint(json_path: str | None, output: str) -> str:
    """Beside the JSON (or the report when there is none); in the temporary folder when those
    are devices, descriptors or FIFOs (`-o /dev/null` must not write into /dev), or when a
    checkpoint's name beside them would be too long."""
    from ..store.files import is_regular_target
    from ..drive.preflight import name_fits

    for base in (json_path, output):
        if not base or not is_regular_target(base):
            continue
        folder, name = os.path.split(base.rstrip(os.sep) or base)  # `..` kept: it is read after symlinks
        if name in ("", ".", ".."):
            continue
        dot = name.rfind(".")
        stem = name[:dot] if 0 < dot < len(name) - 1 else name  # pathlib's stem: "a.json" -> "a", ".x" and "a." kept
        candidate = os.path.join(folder, stem + ".energyprof-checkpoint.json")
        if name_fits(candidate):
            return candidate
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"energyprof-{os.getpid()}.checkpoint.json")


@record
class RunPlan:
    """A run as the command line asked for it, checked: what runs, where its outputs go, and (one rank of
    several) the job it belongs to."""

    options: Any
    command: list[str]
    target: str
    executable: str | None
    shown: list[str]  # energyprof's command line as the profile records it (credentials redacted)
    knob_plan: list[tuple[Any, float]]
    rank: Any = None  # engines.distributed's rank info; None for a single process
    values: dict[str, str] = field(default_factory=dict)  # the output names' placeholders
    job: dict[str, str] = field(default_factory=dict)  # rank 0's job outputs (output, json)
    rank_json: str | None = None


def run(argv: list[str]) -> int:
    if sys.flags.inspect:  # -i or PYTHONINSPECT: the supervisor would open a prompt after the program
        print(f"{PROG}: error: -i or PYTHONINSPECT (inspect after the program) cannot be used with energyprof:"
              " run python -i without it", file=sys.stderr, flush=True)
        os._exit(2)  # a SystemExit would print a traceback and open the prompt all the same
    plan = parse(argv)
    preflight(plan)
    return launch(plan)


def parse(argv: list[str]) -> RunPlan:
    """The command line into a plan: the options (every output per rank where the run is one rank of
    several), what to run, and the knobs to set; UsageError or OptionError, one line, for bad input."""
    parser = build_run_parser()
    own, script, module, prog_args = split_argv(parser, argv)
    ns = parser.parse_args(own)
    command_form = script is not None and len(own) < len(argv) and argv[len(own)] == "--"
    from ..engines import distributed

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
    checkpoint = ns.checkpoint or default_checkpoint(ns.json, output)
    # Relative outputs stay relative to the folder energyprof started in: the program's
    # os.chdir happens in its own process.
    options = build_options(ns, output=output, checkpoint=checkpoint)
    knob_plan = plan_knobs(ns.knob or [], options.powercap_root)
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
    launcher = sys.argv[0] if sys.argv else PROG
    shown = ["python -m energyprof" if launcher.endswith("__main__.py") else os.path.basename(launcher), *argv]
    if options.influx or options.pushgateway:  # the profile, the page and MLflow keep no credential
        from ..setup.targets import redacted_argv

        shown = redacted_argv(shown, [options.influx or "", options.pushgateway or ""])
    return RunPlan(options, command, target, executable, shown, knob_plan, rank, values, job, rank_json)


def preflight(plan: RunPlan) -> None:
    """What must hold before the program starts, beyond the options' own checks: rank 0's job outputs
    writable, and with --mlflow the run the program's windows and the totals go to (made here)."""
    rank = plan.rank
    if rank is not None and rank.rank == 0:
        from ..drive.preflight import check_writable
        from ..engines import distributed

        for name, path in plan.job.items():  # the job's outputs, written by rank 0 at the end
            check_writable(distributed.expand(distributed.job_name(path), plan.values), flag(name))
    if plan.options.mlflow:  # one program, one run: made here, found by the program's windows and the totals
        from ..output import mlflow as ml

        try:
            if rank is not None:  # one rank of several: the job's run, under this rank's keys
                os.environ[ml.RUN_ENV] = ml.open_job_run(rank.job)
                os.environ[ml.RANK_ENV] = str(rank.rank)
            else:
                os.environ[ml.RUN_ENV] = ml.open_run()
        except ml.StoreError as exc:
            raise UsageError(str(exc)) from None


def launch(plan: RunPlan) -> int:
    """Run the program under the supervisor (its knobs set, and put back before anything else once it has
    ended), write the outputs, join a job's ranks on rank 0; the program's exit status, or its signal."""
    from ..engines import distributed
    from ..output.writer import write_outputs
    from ..supervise import signals
    from ..supervise.supervisor import SpawnError, Supervisor

    options, rank = plan.options, plan.rank
    output = options.output
    reader = distributed.NodeReader(os.path.dirname(options.json or output), rank) if rank is not None else None
    meta = {"distributed": rank.to_meta(reader.elected)} if rank is not None and reader is not None else None
    keeper = None
    if plan.knob_plan:
        keeper, knob_meta = set_knobs(plan.knob_plan)
        meta = {**(meta or {}), "knobs": knob_meta}
    try:
        sup = Supervisor(options, plan.command, plan.target, plan.shown, executable=plan.executable, meta=meta)
        if not gc.isenabled():  # off since __main__: what start-up made stays, so no collection need walk it again
            gc.freeze()
            gc.enable()
        try:
            profile, status = sup.run()
        except SpawnError as exc:
            raise UsageError(str(exc)) from None
    finally:
        if keeper is not None:  # the program has ended: its knobs go back before anything else
            keeper.close()
    # The program has ended: what writing the outputs makes (the report's modules, the model, the page) lives
    # until energyprof ends, so no collection need walk it (build and render turned it off already; the
    # collections between them were ~1% of an empty run's CPU).
    gc.disable()
    store = None
    if rank is not None and plan.rank_json is not None:
        store = distributed.job_store(os.environ, distributed.gather_timeout(os.environ))
        if store is not None and rank.rank != 0:  # before the files: rank 0 may be waiting
            distributed.publish(store, rank, profile.to_json())
    try:
        write_outputs(profile, options, checkpoint=options.checkpoint)
    except OSError:  # already reported, one line each; the program's exit status stays its own
        pass
    finally:
        sup.finish()
    if reader is not None:
        reader.release()
    if rank is not None and rank.rank == 0 and plan.rank_json is not None:
        _write_job(profile, options, rank, plan.rank_json, plan.values, plan.job, sup.started_wall, store)
    if os.WIFSIGNALED(status):
        signals.die_by(os.WTERMSIG(status))
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def plan_knobs(specs: list[str], powercap_root: str | None) -> list[tuple[Any, float]]:
    """`--knob` checked before the program starts: each names knobs that exist and one value in their range."""
    if not specs:
        return []
    from ..knobs.base import KnobError
    from ..knobs.registry import discover, parse_spec, resolve

    try:
        parsed = [parse_spec(text) for text in specs]
        for spec in parsed:
            if len(spec.values) != 1:
                raise KnobError(f"--knob {spec.name}: one value per run (a sweep takes several: energyprof sweep)")
        kinds = tuple({spec.kind for spec in parsed})
        resolved = resolve(parsed, discover(powercap_root=powercap_root, kinds=kinds))
    except KnobError as exc:
        raise UsageError(f"--knob: {exc}") from None
    return [(knob, spec.values[0]) for spec, knobs in resolved for knob in knobs]


def set_knobs(plan: list[tuple[Any, float]]) -> tuple[Any, dict[str, Any]]:
    """Set each knob through a keeper (which puts it back even after kill -9); the profile's record of them."""
    from ..knobs.base import KnobError
    from ..knobs.keeper import Keeper

    keeper = Keeper()
    record: dict[str, Any] = {}
    try:
        found = {knob.name: knob.read() for knob, _ in plan}  # before any change: overlapping knobs share files
        for knob, value in plan:
            keeper.set(knob, value)
            record[knob.name] = {"value": value, "original": found[knob.name], "unit": knob.unit}
    except KnobError as exc:
        keeper.close()
        raise UsageError(f"--knob: {exc}") from None
    return keeper, record


# ---------------------------------------------------------------- compare


def _write_job(profile: Any, options: Options, rank: Any, rank_json: str, values: dict[str, str],
               job: dict[str, str], started_wall: float, store: Any) -> None:
    """Rank 0, its own outputs written: the other ranks' profiles (through the job's store, or
    from the shared output folder, a bounded wait for those still writing), joined into the
    job's profile and report."""
    from ..engines import distributed
    from ..core.merge import MergeError, merge
    from ..output.writer import write_outputs
    from ..record import replace

    others = distributed.gather(rank_json, values, rank, started_wall, distributed.gather_timeout(os.environ), store)
    ranks = [profile, *(others[r][0] for r in sorted(others))]
    labels = [f"rank {p.meta['distributed']['rank']}" for p in ranks]
    try:
        joined = merge(ranks, labels, world_size=rank.world_size, policy=options.idle)
    except MergeError as exc:
        print(f"energyprof: could not join the ranks' profiles: {exc}", file=sys.stderr)
        return
    gathered = {str(r): how for r, (_, how) in sorted(others.items())}
    joined = joined.with_meta(distributed={**joined.meta["distributed"], "gathered": gathered})
    paths = {k: distributed.expand(distributed.job_name(v), values) for k, v in job.items()}
    job_options = replace(options, output=paths["output"], json=paths["json"], speedscope=None,
                          folded=None, csv=None, pprof=None, checkpoint=None)
    if options.mlflow:  # the joined job's figures go under the run's own keys, and end it
        from ..output.mlflow import RANK_ENV

        os.environ.pop(RANK_ENV, None)
    try:
        write_outputs(joined, job_options)
    except OSError:
        pass


# ---------------------------------------------------------------- merge
