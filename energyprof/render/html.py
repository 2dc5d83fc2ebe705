"""The HTML report: one self-contained page from the report model that opens with the network off.

The page is static HTML written by page.py (cards and methodology print without scripts) plus
plotly.js inlined once, and every piece of data the scripts need travels as JSON in
`<script type="application/json">` blocks with `<`, `>` and `&` escaped, so a function called
`</script>` stays text. The same model gives byte-for-byte the same page, whether from the live
run or from `energyprof report`.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import re
from typing import Any

from ..analysis.report import ReportModel
from ..store.files import FileBytes
from .cards import methodology, process_rows, rank_epoch_rows, summary_cards, sweep_choice
from .charts import report_data

MAX_WINDOW_ROWS = 200
PLOTLY_FILE = "plotly-custom.min.js"  # scripts/build-plotly-bundle.sh; its version and build in plotly-custom.json
# Where plotly.js goes, put in after the page is written, so its 1.2 MB is copied once. Escaped
# program text can hold no "<", so this mark can only be the page's own.
_PLOTLY_MARK = "<energyprof-plotly-bundle>"

def isolate(text: Any) -> str:
    """Text in a first-strong isolate (U+2068 ... U+2069): right-to-left characters or overrides in a
    path cannot reorder what is around it. The template also wraps program strings in <bdi>."""
    return "\u2068" + str(text) + "\u2069"


def header(model: ReportModel) -> dict[str, str]:
    """Program strings of the page's header and title, isolated from the text around them."""
    return {"target": isolate(model.meta.get("target") or "profile")}


def template_dir() -> str:
    """The page's styles and scripts ship inside the wheel as energyprof/templates; a source checkout has them at the top."""
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    for candidate in (os.path.join(here, "templates"), os.path.join(os.path.dirname(here), "templates")):
        if os.path.isfile(os.path.join(candidate, "report.js")):
            return candidate
    raise FileNotFoundError("energyprof's report templates are missing from this installation")


def template_bytes(name: str) -> bytes:
    """One file of the page's templates, as it ships."""
    with open(os.path.join(template_dir(), name), "rb") as fh:
        return fh.read()


def template_text(name: str) -> str:
    """One file of the page's templates as text (UTF-8, newlines as Python reads them)."""
    with open(os.path.join(template_dir(), name), encoding="utf-8") as fh:
        return fh.read()


def render_html(model: ReportModel) -> str:
    """The whole page as one string (plotly.js, styles, scripts and data inlined)."""
    before, after = _without_gc(model)
    return _encodable(before) + _plotly_js() + _encodable(after)


def _encodable(text: str) -> str:
    """The text with each lone surrogate as its escape (as render_html_bytes writes it), so a notebook or
    any writer can encode the page."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def render_html_bytes(model: ReportModel) -> bytes:
    """The same page as UTF-8, in one object (what `render_html_parts` writes)."""
    before, after = _without_gc(model)
    return b"".join((_utf8(before), _plotly_js_bytes(), _utf8(after)))


def render_html_parts(model: ReportModel) -> tuple[bytes, FileBytes, bytes]:
    """The page as UTF-8 in three parts, for a file (store/files.write_text writes them in order): plotly.js's
    1.2 MB go in from its file, copied by the kernel, never read into this process (decoding and encoding
    them was 3 ms of an empty run's fixed cost, copying them into one object with the rest 2 ms more,
    reading and writing them ~1 ms)."""
    before, after = _without_gc(model)
    return _utf8(before), _plotly_js_file(), _utf8(after)


def _utf8(text: str) -> bytes:
    # A name with a lone surrogate (undecodable bytes in a path, a kernel name) has no UTF-8 form: it is
    # written as its escape, \ud800, whatever its code points; in a JSON block that is the JSON escape of
    # the same string, so the scripts read the name as it was.
    return text.encode("utf-8", "backslashreplace")


def _without_gc(model: ReportModel) -> tuple[str, str]:
    # A 50,000-function profile makes a few hundred thousand small objects that live until the
    # page is written; the cyclic GC rescanning them cost a third of the build time.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _render(model)
    finally:
        if enabled:
            gc.enable()


def _render(model: ReportModel) -> tuple[str, str]:
    """The page before plotly.js and after it."""
    from .page import render_page

    data = report_data(model)
    page = render_page({
        "m": model,
        "meta": model.meta,
        "header": header(model),
        "started": str(model.meta.get("started_at") or "")[:19].replace("T", " "),
        "cards": summary_cards(model),
        "procs": process_rows(model),
        "rank_epoch_rows": rank_epoch_rows,
        "sweep_choice": lambda name: sweep_choice(model, name),
        "method": methodology(model),
        "gpu": _gpu_panel(model),
        "has_timeline": data["timeline"] is not None,
        "window_rows": sorted(model.windows, key=lambda r: r.window.start_s)[:MAX_WINDOW_ROWS],
        "report_json": packed_json(data),
        "plotly_js": _PLOTLY_MARK,
        "app_js": _inline_script(_shipped("report.js")),
        "styles": _shipped("report.css"),
    })
    at = page.rfind(_PLOTLY_MARK)  # the last: only our own report.js comes after it
    return page[:at], page[at + len(_PLOTLY_MARK):]


def _gpu_panel(model: ReportModel) -> dict[str, Any] | None:
    if model.profile.gpu_kernels is None:  # no kernel facts: the GPU panel's modules are not loaded
        return None
    from .gpu import gpu_panel

    return gpu_panel(model)


def packed_json(data: Any) -> str:
    """`data` as JSON, raw-deflated and in base64, for the page's data block (`data-encoding="deflate"`):
    a fourth of its size (LeNet's 150 KB become 50 KB), and no character a script block could mistake
    for its end. The page inflates it with its own few lines of JavaScript, synchronously. (binascii, the C
    module under base64: the base64 module's import is work every report would repeat for one call.)"""
    import binascii
    import zlib

    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode("utf-8", "backslashreplace")
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: no zlib header or checksum to read
    return binascii.b2a_base64(packer.compress(text) + packer.flush(), newline=False).decode("ascii")


def unpacked_json(block: str) -> Any:
    """What `packed_json` packed (for tools and tests that read a saved page's data)."""
    import base64
    import zlib

    return json.loads(zlib.decompress(base64.b64decode(block), -15).decode("utf-8"))


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
    return _plotly_js_bytes().decode("utf-8")


@functools.lru_cache(maxsize=1)
def _plotly_js_bytes() -> bytes:
    return re.sub(rb"</(script)", rb"<\\/\1", template_bytes(PLOTLY_FILE), flags=re.IGNORECASE)


def _plotly_js_file() -> FileBytes:
    """plotly.js as the page inlines it: the shipped file as it is. It holds no "</script" for the escape
    `_plotly_js_bytes` makes to change (tests/test_plotly_bundle.py holds the bundle to that)."""
    return FileBytes(os.path.join(template_dir(), PLOTLY_FILE))


def _shipped(name: str) -> str:
    """A file shipped beside the page, read as bytes and decoded once: through a text stream's newline
    translation, plotly.js's 1.2 MB took 5 ms, a twentieth of an empty run's whole fixed cost."""
    return template_bytes(name).decode("utf-8")
