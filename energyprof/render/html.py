"""The HTML report: one self-contained file from a jinja2 template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..profile import Profile, write_atomic


def template_dir() -> Path:
    """Templates ship inside the wheel as energyprof/templates; a source checkout has them at the top."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "report.html.j2").is_file():
            return candidate
    raise FileNotFoundError("energyprof's report templates are missing from this installation")


def _json_script(data: Any) -> str:
    """JSON safe inside <script type="application/json">: no '<', '>' or '&' survive."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(profile: Profile) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir())),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    from .console import top_functions

    rows = []
    total = profile.total_energy_j or 1.0
    for node, depth in profile.nodes():
        rows.append({"function": node.function, "file": node.file, "line": node.line, "depth": depth,
                     "energy": node.total_energy, "self_energy": node.self_total_energy, "time": node.time_s,
                     "share": node.total_energy / total * 100, "samples": node.samples,
                     "err": node.relative_error})
    return env.get_template("report.html.j2").render(
        profile=profile, rows=rows, top=top_functions(profile, 20),
        profile_json=_json_script(profile.to_dict()),
    )


def write_html(profile: Profile, path: str) -> None:
    write_atomic(Path(path), render_html(profile))
