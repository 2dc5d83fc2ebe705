"""The one writer: renders the report model for every requested output and writes the files.

Regular files are replaced atomically (a reader never sees half a report); a device or FIFO
(`-o /dev/null`, a pipe) is written through, and a symlink is followed to its target, so an
output never replaces something that is not a regular file.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from .files import write_text
from .render.registry import renderers
from .options import Options

if TYPE_CHECKING:
    from .analysis.carbon import CarbonSettings
    from .analysis.report import RenderOptions
    from .profile import Profile


def carbon_settings(options: Options) -> CarbonSettings:
    """Resolve where the intensity comes from (codecarbon's data, a trace file): the I/O before the
    pure arithmetic. Raises ValueError with one line for an unknown location or a bad trace."""
    from pathlib import Path

    from .analysis.carbon import CarbonSettings
    from .intensity import load_trace, lookup

    trace = load_trace(options.carbon_intensity_trace) if options.carbon_intensity_trace else None
    return CarbonSettings(intensity=lookup(options), trace=trace,
                          trace_name=Path(options.carbon_intensity_trace).name if trace else "",
                          pue=float(options.pue), price_per_kwh=options.price_per_kwh, currency=options.currency)


def render_options(options: Options, idle: str | None = None) -> RenderOptions:
    """The render options of a command line or API call (idle None: the profile's own policy)."""
    from .analysis.report import RenderOptions

    return RenderOptions(idle=idle, carbon=carbon_settings(options))


def write_outputs(profile: Profile, options: Options, stream: TextIO | None = None,
                  render: RenderOptions | None = None) -> list[str]:
    """Build the report model once and write every requested file, each on its own (one failing
    loses none of the others). Prints the console summary unless quiet.

    Returns the paths written; raises OSError after trying them all if any failed.
    """
    from .analysis.report import build
    from .options import OUTPUTS

    model = build(profile, render if render is not None else render_options(options))
    written: list[str] = []
    failed: list[str] = []
    table = renderers()
    for name in OUTPUTS:
        path = getattr(options, name)
        if not path:
            continue
        try:
            write_text(path, table[name](model))
            written.append(path)
        except Exception as exc:  # noqa: BLE001 - report it, keep the other outputs
            failed.append(f"could not write {path}: {exc}")
    logged = None
    if options.mlflow:  # after the files, so a tracking server that is down loses none of them
        try:
            from .integrations.mlflow import log_model

            logged = log_model(model)
        except Exception as exc:  # noqa: BLE001 - report it like an output that failed
            failed.append(f"could not log to MLflow: {exc}")
    out = stream or sys.stderr
    if options.summary and not options.quiet:
        from .render.console import render_summary

        out.write(render_summary(model))
        for path in written:
            out.write(f"energyprof: wrote {path}\n")
        if logged:
            out.write(f"energyprof: logged to MLflow run {logged}\n")
    for line in failed:
        out.write(f"energyprof: error: {line}\n")
    out.flush()
    if failed:
        raise OSError("; ".join(failed))
    return written
