"""Write what the user asked for from a finished Profile (renderers are imported lazily)."""

from __future__ import annotations

import sys
from typing import Callable, TextIO

from .options import Options
from .profile import Profile


def _writers(options: Options) -> list[tuple[str, Callable[[Profile, str], None]]]:
    """(path, writer) for each requested output; the JSON first: it is the one to keep."""

    def html(profile: Profile, path: str) -> None:
        from .render.html import write_html

        write_html(profile, path)

    def pprof(profile: Profile, path: str) -> None:
        from .render.pprof import write_pprof

        write_pprof(profile, path)

    def export(name: str) -> Callable[[Profile, str], None]:
        def write(profile: Profile, path: str) -> None:
            from .render import exports

            getattr(exports, f"write_{name}")(profile, path)
        return write

    wanted: list[tuple[str | None, Callable[[Profile, str], None]]] = [
        (options.json, lambda profile, path: profile.save(path)),
        (options.output, html),
        (options.speedscope, export("speedscope")),
        (options.folded, export("folded")),
        (options.csv, export("csv")),
        (options.pprof, pprof),
    ]
    return [(path, writer) for path, writer in wanted if path]


def write_outputs(profile: Profile, options: Options, stream: TextIO | None = None) -> list[str]:
    """Write every requested file, each on its own (one failing loses none of the others).

    Returns the paths written; prints the console summary unless quiet. Raises OSError
    after trying them all if any failed.
    """
    written: list[str] = []
    failed: list[str] = []
    for path, writer in _writers(options):
        try:
            writer(profile, path)
            written.append(path)
        except Exception as exc:  # noqa: BLE001 - report it, keep the other outputs
            failed.append(f"could not write {path}: {exc}")
    logged = None
    if options.mlflow:  # after the files, so a tracking server that is down loses none of them
        try:
            from .integrations.mlflow import log_profile

            logged = log_profile(profile)
        except Exception as exc:  # noqa: BLE001 - report it like an output that failed
            failed.append(f"could not log to MLflow: {exc}")
    out = stream or sys.stderr
    if options.summary and not options.quiet:
        from .render.console import render_summary

        out.write(render_summary(profile))
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
