"""IPython and Jupyter: `%load_ext energyprof`, then `%%energyprof [options]` or `%energyprof statement`.

Each profiles the cell (or statement) in the kernel's own process with the in-process profiler,
prints the summary, shows the report inline in a sandboxed iframe (its scripts run in a frame
of their own, so the notebook's page is never touched), and keeps the Profile as `_energyprof`
in the notebook's namespace.

plotly.js (1.2 MB) is sent once per session, in `%load_ext energyprof`'s output: a small
script there keeps it and hands it to each report's frame on request (postMessage, so the
frames stay sandboxed). A report cell's output is then its figures alone (tens of KB, not
1.5 MB a cell). Options are the command line's (`--power-trace`, `--idle`,
`--country`, `-o report.html`, `--json p.json`, ...); no file is written unless asked.
"""

from __future__ import annotations

import html
import shlex
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..analysis.report import ReportModel

IFRAME_HEIGHT_PX = 760
NAME = "_energyprof"


def load_ipython_extension(ip: Any) -> None:
    """Register `%energyprof` and `%%energyprof` (IPython calls this on `%load_ext energyprof`), and
    put plotly.js in the notebook's page once, for every report of the session."""
    ip.register_magic_function(lambda line, cell=None: energyprof_magic(ip, line, cell),
                               magic_kind="line_cell", magic_name="energyprof")
    from IPython.display import display

    display({"text/html": plotly_host()}, raw=True)


#: what a report's frame posts to its parent to ask for plotly.js, and the key of the answer
ASK = "energyprof:plotly?"
ANSWER = "energyprofPlotly"


def plotly_host() -> str:
    """The notebook-side script: keeps plotly.js's source and answers each report frame that asks."""
    from ..render.html import _plotly_js, json_for_script

    return ("<script>(function () {\n"
            f"  window.__energyprofPlotly = {json_for_script(_plotly_js())};\n"
            "  if (window.__energyprofListening) return;\n"
            "  window.__energyprofListening = true;\n"
            "  window.addEventListener('message', function (e) {\n"
            f"    if (e.data === {json_for_script(ASK)} && e.source)\n"
            f"      e.source.postMessage({{{ANSWER}: window.__energyprofPlotly}}, '*');\n"
            "  });\n"
            "})();</script><div style='font-size:12px;color:#666'>energyprof: loaded (plotly.js for this"
            " session's reports, sent once)</div>")


def frame_page(page: str) -> str:
    """The report page without plotly.js: it asks the notebook's page for it, runs it, then its own script."""
    from ..render.html import _inline_script, _plotly_js, json_for_script, template_text

    bundle = f"<script>{_plotly_js()}</script>"
    app = f"<script>{_inline_script(template_text('report.js'))}</script>"
    at_bundle, at_app = page.rfind(bundle), page.rfind(app)
    if at_bundle < 0 or at_app < at_bundle:
        return page  # not the page this expects: keep it whole
    loader = ("<script>(function () {\n"
              "  function run(code) { var s = document.createElement('script'); s.text = code;"
              " document.body.appendChild(s); }\n"
              "  var done = false;\n"
              "  window.addEventListener('message', function (e) {\n"
              f"    if (done || !e.data || typeof e.data.{ANSWER} !== 'string') return;\n"
              f"    done = true; run(e.data.{ANSWER});"
              " run(document.getElementById('energyprof-app').textContent);\n"
              "  });\n"
              f"  parent.postMessage({json_for_script(ASK)}, '*');\n"
              "  setTimeout(function () { if (!done) document.body.insertAdjacentHTML('afterbegin',"
              " '<p>plotly.js is not in this notebook page: run %load_ext energyprof again.</p>'); }, 5000);\n"
              "})();</script>")
    kept = app.replace("<script>", '<script type="text/plain" id="energyprof-app">', 1)
    return page[:at_bundle] + page[at_bundle + len(bundle):at_app] + kept + loader + page[at_app + len(app):]


def _options(tokens: list[str]) -> Any:
    from ..cli.common import UsageError, build_options
    from ..cli.run import build_run_parser

    parser = build_run_parser()
    parser.prog = "%energyprof"
    try:
        ns = parser.parse_args(tokens)
    except UsageError as exc:
        raise ValueError(f"%energyprof: {exc}") from None
    if ns.module is not None:
        raise ValueError("%energyprof: -m has no meaning in a notebook: the cell is the program")
    return build_options(ns, output=ns.output)  # no report file unless -o is given


def _split(line: str, cell: str | None) -> tuple[list[str], str]:
    """(option tokens, code). A line magic's options end at `--`: `%energyprof --idle all -- f()`."""
    if cell is not None:
        return shlex.split(line), cell
    stripped = line.strip()
    if stripped.startswith("-") and " -- " in f" {stripped} ":
        opts, _, code = f" {stripped} ".partition(" -- ")
        return shlex.split(opts), code.strip()
    return [], stripped


def energyprof_magic(ip: Any, line: str, cell: str | None = None) -> Any:
    from ..analysis.report import build
    from ..output.writer import render_options
    from ..output.writer import write_outputs
    from ..drive.profiler import Profiler
    from ..agent.frames import anchor_depth

    try:
        tokens, code = _split(line, cell)
        options = _options(tokens)
    except ValueError as exc:  # bad options (OptionError is one): one line, like the CLI
        print(str(exc) if str(exc).startswith("%energyprof") else f"%energyprof: {exc}", file=sys.stderr)
        return None
    source = ip.transform_cell(code) if cell is not None else code
    filename = ip.compile.cache(source)
    compiled = ip.compile(source, filename, "exec" if cell is not None else "single")
    prof = Profiler(options)
    try:
        prof.start(target="<cell>" if cell is not None else code[:60], _anchor=anchor_depth(sys._getframe(0)))
    except RuntimeError as exc:  # a profile already runs in the kernel: the cell is part of it
        print(f"%energyprof: {exc}; the cell runs as part of it", file=sys.stderr)
        exec(compiled, ip.user_ns)  # noqa: S102
        return None
    exc_info: BaseException | None = None
    try:
        exec(compiled, ip.user_ns)  # noqa: S102 - the user's own cell, as IPython runs it
    except BaseException as exc:  # the cell's own error: shown by IPython after the profile is kept
        exc_info = exc
    status = {"status": "completed"} if exc_info is None else \
        {"status": "exception", "exception": f"{type(exc_info).__name__}: {exc_info}"}
    profile = prof.stop(status)
    ip.user_ns[NAME] = profile
    render = render_options(options)  # the cell's --idle, --country, ...: the page shows what the files do
    try:
        write_outputs(profile, options, stream=sys.stdout, render=render)
    except OSError:
        pass  # already printed, one line per output
    _show(build(profile, render))
    if exc_info is not None:
        raise exc_info
    return None


def iframe(page: str, height_px: int = IFRAME_HEIGHT_PX) -> str:
    """The report as a sandboxed iframe: scripts run, but in an opaque origin with no access to the notebook."""
    return (f'<iframe sandbox="allow-scripts" style="width:100%;height:{height_px}px;border:1px solid #ddd"'
            f' srcdoc="{html.escape(page, quote=True)}"></iframe>')


def _show(model: ReportModel) -> None:
    from IPython.display import display

    from ..render.html import render_html

    # raw: IPython's HTML() warns about an <iframe> (a UserWarning in every cell's output)
    display({"text/html": iframe(frame_page(render_html(model)))}, raw=True)
