"""Which renderer makes each output: option name -> (report model -> text, bytes, or a tuple of bytes that
store/files.write_text writes in order: the page's, whose plotly.js is never copied into one object)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable


if TYPE_CHECKING:
    from ..analysis.report import ReportModel


def renderers() -> dict[str, Callable[[ReportModel], str | bytes | tuple[bytes, ...]]]:
    """The JSON is the facts plus a derived block; the others read only the model."""
    from . import exports
    from .html import render_html_parts

    return {
        "json": lambda m: m.profile.to_json(derived=m.derived()),
        "output": render_html_parts,
        "speedscope": exports.speedscope_text,
        "folded": exports.folded_text,
        "csv": exports.csv_text,
        "pprof": _pprof,
    }


def _pprof(model: ReportModel) -> bytes:
    from .pprof import pprof_gzip  # with gzip, only for runs that ask for it

    return pprof_gzip(model)
