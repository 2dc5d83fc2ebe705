"""The HTML report: one self-contained page from the report model that opens with the network off.

The page is static HTML from a jinja2 template (cards and methodology print without scripts) plus
plotly.js inlined once, and every piece of data the scripts need travels as JSON in
`<script type="application/json">` blocks with `<`, `>` and `&` escaped, so a function called
`</script>` stays text. The same model gives byte-for-byte the same page, whether from the live
run or from `energyprof report`.
"""

from __future__ import annotations

import functools
import gc
import json
import re
from pathlib import Path
from typing import Any

from ..analysis.report import ReportModel
from .cards import methodology, process_rows, rank_epoch_rows, summary_cards, sweep_choice
from .charts import report_data
from .format import fmt_bytes, fmt_energy, fmt_grams, fmt_money, fmt_seconds

MAX_WINDOW_ROWS = 200
# Where plotly.js goes, put in after rendering: through the template, its 1.2 MB went through two
# Markup copies and an escape check (4 ms). Escaped program text can hold no "<", so this mark can
# only be the template's own.
_PLOTLY_MARK = "<energyprof-plotly-bundle>"

def isolate(text: Any) -> str:
    """Text in a first-strong isolate (U+2068 ... U+2069): right-to-left characters or overrides in a
    path cannot reorder what is around it. The template also wraps program strings in <bdi>."""
    return "\u2068" + str(text) + "\u2069"


def header(model: ReportModel) -> dict[str, str]:
    """Program strings of the page's header and title, isolated from the text around them."""
    return {"target": isolate(model.meta.get("target") or "profile")}


def template_dir() -> Path:
    """Templates ship inside the wheel as energyprof/templates; a source checkout has them at the top."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "report.html.j2").is_file():
            return candidate
    raise FileNotFoundError("energyprof's report templates are missing from this installation")


def render_html(model: ReportModel) -> str:
    """The whole page as one string (plotly.js, styles, scripts and data inlined)."""
    # A 50,000-function profile makes a few hundred thousand small objects that live until the
    # page is written; the cyclic GC rescanning them cost a third of the build time.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _render(model)
    finally:
        if enabled:
            gc.enable()


def _render(model: ReportModel) -> str:
    import jinja2

    from ..cache import folder

    cached = folder()
    # The template compiled to Python, kept between runs (keyed by its source's checksum):
    # compiling it was a third of an empty script's whole cost.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir())),
                             autoescape=True, undefined=jinja2.ChainableUndefined,
                             trim_blocks=True, lstrip_blocks=True,
                             bytecode_cache=jinja2.FileSystemBytecodeCache(cached) if cached else None)
    env.filters["energy"] = fmt_energy
    env.filters["seconds"] = fmt_seconds
    env.filters["bytes"] = fmt_bytes
    env.filters["grams"] = fmt_grams
    env.filters["money"] = fmt_money
    from .gpu import gpu_panel

    data = report_data(model)
    page = env.get_template("report.html.j2").render(
        m=model,
        meta=model.meta,
        header=header(model),
        started=str(model.meta.get("started_at") or "")[:19].replace("T", " "),
        cards=summary_cards(model),
        procs=process_rows(model),
        rank_epoch_rows=rank_epoch_rows,
        sweep_choice=lambda name: sweep_choice(model, name),
        method=methodology(model),
        gpu=gpu_panel(model),
        has_timeline=data["timeline"] is not None,
        window_rows=sorted(model.windows, key=lambda r: r.window.start_s)[:MAX_WINDOW_ROWS],
        report_json=json_for_script(data),
        plotly_js=_PLOTLY_MARK,
        app_js=_inline_script((template_dir() / "report.js").read_text(encoding="utf-8")),
        styles=(template_dir() / "report.css").read_text(encoding="utf-8"),
    )
    at = page.rfind(_PLOTLY_MARK)  # the last: only our own report.js comes after it
    return page[:at] + _plotly_js() + page[at + len(_PLOTLY_MARK):]


def json_for_script(data: Any) -> str:
    """JSON safe inside <script type="application/json">: no '<', '>' or '&' survive."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _inline_script(code: str) -> str:
    """An inline script ends at the first "</script", wherever it is (even in a comment)."""
    return re.sub(r"</(script)", r"<\\/\1", code, flags=re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def _plotly_js() -> str:
    """plotly.js built with only the traces the report draws (scripts/build-plotly-bundle.sh; the
    version and build are in plotly-custom.json beside it), read once per process."""
    return _inline_script((template_dir() / "plotly-custom.min.js").read_text(encoding="utf-8"))
