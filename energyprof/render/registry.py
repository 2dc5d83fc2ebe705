"""Which renderer makes each output: option name -> (report model -> text, bytes, or a tuple of parts that
store/files.write_text writes in order: the page's, whose plotly.js is copied from its file, never read)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable


if TYPE_CHECKING:
    from ..analysis.report import ReportModel
    from ..store.files import FileBytes


def renderers() -> dict[str, Callable[[ReportModel], str | bytes | tuple[bytes | FileBytes, ...]]]:
    """The JSON is the facts plus a derived block; the others read only the model."""
    from .html import render_html_parts

    return {
        "json": lambda m: m.profile.to_json(derived=m.derived()),
        "output": render_html_parts,
        "speedscope": lambda m: _exports().speedscope_text(m),
        "folded": lambda m: _exports().folded_text(m),
        "csv": lambda m: _exports().csv_text(m),
        "pprof": _pprof,
    }


def _exports() -> Any:
    from . import exports  # only for a run that asks for an export

    return exports


def _pprof(model: ReportModel) -> bytes:
    from .pprof import pprof_gzip  # with gzip, only for runs that ask for it

    return pprof_gzip(model)
