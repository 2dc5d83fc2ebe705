"""Write what the user asked for from a finished Profile (renderers are imported lazily)."""

from __future__ import annotations

import sys
from typing import TextIO

from .options import Options
from .profile import Profile


def write_outputs(profile: Profile, options: Options, stream: TextIO | None = None) -> list[str]:
    """Write every requested file; return their paths. Console summary unless quiet."""
    written: list[str] = []
    if options.json:
        profile.save(options.json)
        written.append(options.json)
    if options.output:
        from .render.html import write_html

        write_html(profile, options.output)
        written.append(options.output)
    exporters = {"speedscope": "write_speedscope", "folded": "write_folded", "csv": "write_csv"}
    for name, func in exporters.items():
        path = getattr(options, name)
        if path:
            from .render import exports

            getattr(exports, func)(profile, path)
            written.append(path)
    if options.summary and not options.quiet:
        from .render.console import render_summary

        out = stream or sys.stderr
        out.write(render_summary(profile))
        for path in written:
            out.write(f"energyprof: wrote {path}\n")
        out.flush()
    return written
