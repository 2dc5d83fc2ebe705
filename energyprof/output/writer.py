"""The one writer: saves the profile's facts, then renders the report model for every view.

The JSON is written first, straight from the Profile; each view (HTML, exports) is then
rendered and written on its own, so a failing view is one line naming it and loses nothing
else. files.py says how each kind of path is written (never harming a device, FIFO or descriptor).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from ..store.files import write_text
from ..setup.choices import OUTPUTS
from ..setup.choices import flag

if TYPE_CHECKING:
    from ..setup.options import Options
    from ..analysis.carbon import CarbonSettings
    from ..analysis.report import RenderOptions
    from ..facts.profile import Profile


def carbon_settings(options: Options) -> CarbonSettings:
    """Resolve where the intensity comes from (codecarbon's data, a trace file): the I/O before the
    pure arithmetic. Raises ValueError with one line for an unknown location or a bad trace."""
    from ..analysis.carbon import CarbonSettings
    from ..carbon.intensity import load_trace
    from ..carbon.intensity import lookup

    trace = load_trace(options.carbon_intensity_trace) if options.carbon_intensity_trace else None
    return CarbonSettings(intensity=lookup(options), trace=trace,
                          trace_name=os.path.basename(os.path.normpath(options.carbon_intensity_trace)) if trace else "",
                          pue=float(options.pue), price_per_kwh=options.price_per_kwh, currency=options.currency)


def render_options(options: Options, idle: str | None = None) -> RenderOptions:
    """The render options of a command line or API call (idle None: the profile's own policy)."""
    from ..analysis.report import RenderOptions

    return RenderOptions(idle=idle, carbon=carbon_settings(options))


class _Outcome:
    """What writing the outputs did: the paths written, one line per failure, where the facts wait."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.failed: list[str] = []
        self.kept: str | None = None  # the checkpoint path holding the facts until the views are written
        self.logged: str | None = None  # the MLflow run logged to
        self.logged_s: tuple[float, float] = (0.0, 0.0)  # what logging it took after the run: wall, CPU (s)


def write_outputs(profile: Profile, options: Options, stream: TextIO | None = None,
                  render: RenderOptions | None = None, checkpoint: str | None = None) -> list[str]:
    """Save the facts, then write every requested view, each on its own (one failing loses none
    of the others). Prints the console summary unless quiet.

    Facts first: the profile's JSON is written straight from the Profile before any view is
    rendered. `checkpoint` (a run's checkpoint file) is removed only once the facts are on disk;
    with no JSON asked for, the profile itself is saved there first and removed once every view
    is written, so a failing view never loses the run.

    Returns the paths written; raises OSError after trying them all if any failed.
    """
    views = [name for name in OUTPUTS if name != "json" and getattr(options, name)
             and os.path.realpath(getattr(options, name)) != os.devnull]  # `-o /dev/null`: nothing reads it
    done = _Outcome()
    profile, model = _model(profile, options, views, render, done)
    _save_facts(profile, options, model, views, checkpoint, done)
    _write_views(model, options, views, done)
    if done.kept is not None and not done.failed:
        from ..store.files import remove

        remove(done.kept)
        done.kept = None
    _say(model, options, stream or sys.stderr, done)
    if done.failed:
        raise OSError("; ".join(done.failed))
    return done.written


def _model(profile: Profile, options: Options, views: list[str], render: RenderOptions | None,
           done: _Outcome) -> tuple[Profile, Any]:
    """The report model (the analysis, and its imports) only where something reads it; the profile under
    the render's idle policy (`report --idle all`: a copy)."""
    wanted = bool(options.json or views or options.emissions_csv or options.mlflow or (options.summary and not options.quiet))
    ro = render if render is not None else render_options(options) if wanted else None
    if ro is not None and ro.idle and ro.idle != profile.idle_policy:
        profile = profile.with_policy(ro.idle)
    if not wanted or ro is None:
        return profile, None
    from ..analysis.report import build

    try:  # the analysis, pure; a view's failure is its own, below
        return profile, build(profile, ro)
    except Exception as exc:  # noqa: BLE001 - the facts are saved all the same
        done.failed.append(f"could not build the report from the profile: {type(exc).__name__}: {exc}")
        return profile, None


def _save_facts(profile: Profile, options: Options, model: Any, views: list[str], checkpoint: str | None,
                done: _Outcome) -> None:
    """The JSON from the Profile; without one, the facts wait at the checkpoint path while a view could fail."""
    from ..store.files import is_regular_target
    from ..store.files import remove

    facts = options.json
    if facts:
        try:
            write_text(facts, profile.to_json(derived=model.derived() if model is not None else None))
            done.written.append(facts)
        except Exception as exc:  # noqa: BLE001 - report it, keep the profile elsewhere
            done.failed.append(f"could not write the JSON profile {facts}: {exc}")
            facts = None
    at_risk = bool(options.json or views or options.emissions_csv or options.mlflow)  # an output that may fail
    if checkpoint and facts is None and at_risk and is_regular_target(checkpoint):
        try:  # no JSON on disk: the facts go where the checkpoint was, until the views are written
            write_text(checkpoint, profile.to_json())
            done.kept = checkpoint
        except Exception as exc:  # noqa: BLE001 - the last checkpoint stays, if there was one
            done.failed.append(f"could not save the profile in {checkpoint}: {exc}")
    elif checkpoint and (facts is not None or not at_risk):
        remove(checkpoint)  # the facts are on disk, or nothing was asked for that a failure could lose


def _write_views(model: Any, options: Options, views: list[str], done: _Outcome) -> None:
    """Each view on its own, then codecarbon's CSV, then MLflow (after the files, so a tracking server that
    is down loses none of them)."""
    if views and model is not None:  # the renderers' modules (the page's, the exports') only for a view to write
        from ..render.registry import renderers

        table = renderers()
    for name in views:  # (the HTML page alone built 1.4 MB for `-o /dev/null`)
        path = getattr(options, name)
        if model is None:
            done.failed.append(f"could not write {flag(name)} {path}: no report model")
            continue
        try:
            write_text(path, table[name](model))
            done.written.append(path)
        except Exception as exc:  # noqa: BLE001 - report it, keep the other outputs
            done.failed.append(f"could not write {flag(name)} {path}: {type(exc).__name__}: {exc}")
    if options.emissions_csv and model is not None:
        try:
            from .emissions import append
            from .emissions import rows

            append(options.emissions_csv, rows(model, windows=options.emissions_csv_windows))
            done.written.append(options.emissions_csv)
        except Exception as exc:  # noqa: BLE001 - report it like an output that failed
            done.failed.append(f"could not append to --emissions-csv {options.emissions_csv}: {exc}")
    if options.mlflow and model is not None:
        try:
            from .mlflow import log_model

            wall0, cpu0 = time.perf_counter(), time.process_time()
            done.logged = log_model(model)
            done.logged_s = (time.perf_counter() - wall0, time.process_time() - cpu0)
        except Exception as exc:  # noqa: BLE001 - report it like an output that failed
            done.failed.append(f"could not log to MLflow: {exc}")


def _say(model: Any, options: Options, out: TextIO, done: _Outcome) -> None:
    """The console summary and what was written (unless quiet), every failure, and where the facts wait."""
    if options.summary and not options.quiet and model is not None:
        from ..render.console import render_summary

        out.write(render_summary(model))
        for path in done.written:
            out.write(f"energyprof: wrote {path}\n")
        if done.logged:
            wall, cpu = done.logged_s
            # after the profiled span, so in no figure of the run: said here instead
            out.write(f"energyprof: logged to MLflow run {done.logged} (measured: {wall:.2f} s, {cpu:.2f} s of "
                      f"energyprof's CPU after the run, in no figure)\n")
    for line in done.failed:
        out.write(f"energyprof: error: {line}\n")
    if done.kept is not None:
        out.write(f"energyprof: the profile is kept in {done.kept} (energyprof report {done.kept} renders it)\n")
    out.flush()
