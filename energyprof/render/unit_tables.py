"""The tests table and the tokens table, for the console summary and the report page.

What each figure means is said in analysis/tests_table.py and analysis/tokens.py (and in
docs/units-tests-tokens.md); here they are only laid out. Both are empty for a run without tests
or batched steps, so other reports are as they were.
"""

from __future__ import annotations

from typing import Any

from ..analysis.tests_table import TestRow, rows_of_tests
from ..analysis.tokens import TokenRun, profile_tokens
from .format import esc, fmt_energy, fmt_seconds

TESTS_SHOWN = 10  # the costliest tests in the console summary: a summary, not the table
REQUESTS_SHOWN = 10
MAX_TESTS_COMPARED = 30
TESTS_ON_PAGE = 500  # one row a test: a large suite's page lists its costliest


def _esc(value: Any) -> str:
    return esc(value)


def _how(row: TestRow) -> str:
    return "estimated" if row.estimated else "measured"


def _budget(row: TestRow) -> str:
    if row.budget_j is None:
        return ""
    verdict = "over" if row.over_budget else "within"
    return f"call {fmt_energy(row.call_j)} {verdict} budget {fmt_energy(row.budget_j)}"


# -- console ------------------------------------------------------------------------------------
def per_test_lines(profile: Any) -> list[str]:
    rows = rows_of_tests(profile)
    if not rows:
        return []
    shown = sorted(rows, key=lambda r: -r.energy_j)[:TESTS_SHOWN]
    out = [f"  tests: {len(rows)}, costliest first (the program's energy over setup, call and teardown;"
           " \u00b1 = where the edges fall within a sensor interval):"]
    for r in shown:
        budget = _budget(r)
        out.append(f"    {fmt_energy(r.energy_j):>9} \u00b1{fmt_energy(r.error_j):<8} {_how(r):<9} {r.outcome:<8}"
                   f" {r.nodeid}{'  ' + budget if budget else ''}")
    return out


def tokens_lines(profile: Any) -> list[str]:
    run = profile_tokens(profile)
    if run is None:
        return []
    out = [f"  batched steps: {run.steps}, {len(run.requests)} requests, {run.output_tokens:g} output tokens;"
           f" {fmt_energy(run.j_per_token)} per output token (the ML.ENERGY method: "
           f"{fmt_energy(run.steady_j_per_token)} steady state, {fmt_energy(run.mlenergy_j)} in all"
           f" against {fmt_energy(run.energy_j)} \u00b1 {fmt_energy(run.error_j)} {_tokens_how(run)};"
           " \u00b1 = where the steps' edges fall within a sensor interval)"]
    for r in sorted(run.requests, key=lambda r: -r.energy_j)[:REQUESTS_SHOWN]:
        out.append(f"    {fmt_energy(r.energy_j):>9} \u00b1{fmt_energy(r.error_j):<8}  prefill {fmt_energy(r.prefill_j):>9}"
                   f"  decode {fmt_energy(r.decode_j):>9}  {fmt_energy(r.j_per_output_token)}/token  {_request(run, r)}")
    return out


def _tokens_how(run: TokenRun) -> str:
    return "estimated" if run.estimated else "measured"


def _request(run: TokenRun, r: Any) -> str:
    """A request's name, with its process where requests came from several (each process names its own)."""
    several = len({q.pid for q in run.requests}) > 1
    return f"{r.request} (pid {r.pid})" if several else r.request


# -- the page -----------------------------------------------------------------------------------
def per_test_section(profile: Any) -> str:
    every = rows_of_tests(profile)
    if not every:
        return ""
    rows = every if len(every) <= TESTS_ON_PAGE else sorted(every, key=lambda r: -r.energy_j)[:TESTS_ON_PAGE]
    shown = "" if rows is every else f" The {len(rows)} costliest of {len(every)} tests, costliest first."
    out = ['<section id="tests" class="panel">\n  <h2>Tests</h2>\n'
           '  <p class="hint">Each test is a window from its setup&#39;s start to its teardown&#39;s end: the program&#39;s '
           'energy in it, the same kind of figure as the total above. &plusmn; is where its edges fall within a sensor '
           f'interval. A budget (<code>@pytest.mark.energy_budget</code>) judges the call phase alone.{shown}</p>\n'
           '  <div class="table-wrap"><table class="windows">\n'
           '    <thead><tr><th>test</th><th>energy</th><th>&plusmn;</th><th></th><th>time</th><th>outcome</th>'
           '<th>budget</th></tr></thead>\n    <tbody>\n']
    for r in rows:
        out.append(f'<tr><td class="fn">{_esc(r.nodeid)}</td><td>{_esc(fmt_energy(r.energy_j))}</td>'
                   f'<td>{_esc(fmt_energy(r.error_j))}</td><td>{_how(r)}</td><td>{_esc(fmt_seconds(r.time_s))}</td>'
                   f'<td>{_esc(r.outcome)}</td><td>{_esc(_budget(r))}</td></tr>\n')
    out.append("    </tbody>\n  </table></div>\n</section>\n\n")
    return "".join(out)


def tokens_section(profile: Any) -> str:
    run = profile_tokens(profile)
    if run is None:
        return ""
    return _tokens_html(run)


def _tokens_html(run: TokenRun) -> str:
    out = ['<section id="tokens" class="panel">\n  <h2>Tokens in batches</h2>\n'
           f'  <p class="hint">{run.steps} batched steps. Each step&#39;s energy (the program&#39;s) is split among its '
           'requests by the tokens each added, prefill and decode apart. Output tokens: one for the prefill, one per '
           'decode token. The ML.ENERGY column gives each request the decode steps&#39; energy per token times its '
           f'output tokens. Per output token: {_esc(fmt_energy(run.j_per_token))}; steady state (decode): '
           f'{_esc(fmt_energy(run.steady_j_per_token))}; the ML.ENERGY method apportions '
           f'{_esc(fmt_energy(run.mlenergy_j))} of the {_esc(fmt_energy(run.energy_j))} &plusmn; '
           f'{_esc(fmt_energy(run.error_j))} {_tokens_how(run)}. &plusmn; is where the steps&#39; edges fall within a '
           'sensor interval, each request its token share of its steps&#39;.</p>\n'
           '  <div class="table-wrap"><table class="windows">\n'
           '    <thead><tr><th>request</th><th>prefill</th><th>decode</th><th>total</th><th>&plusmn;</th><th></th>'
           '<th>prompt tokens</th><th>output tokens</th><th>per output token</th><th>ML.ENERGY method</th></tr>'
           '</thead>\n    <tbody>\n']
    for r in run.requests:
        out.append(f'<tr><td class="fn">{_esc(_request(run, r))}</td><td>{_esc(fmt_energy(r.prefill_j))}</td>'
                   f'<td>{_esc(fmt_energy(r.decode_j))}</td><td>{_esc(fmt_energy(r.energy_j))}</td>'
                   f'<td>{_esc(fmt_energy(r.error_j))}</td><td>{_tokens_how(run)}</td>'
                   f'<td>{r.prefill_tokens:g}</td><td>{r.output_tokens:g}</td>'
                   f'<td>{_esc(fmt_energy(r.j_per_output_token))}</td><td>{_esc(fmt_energy(r.mlenergy_j))}</td></tr>\n')
    out.append("    </tbody>\n  </table></div>\n</section>\n\n")
    return "".join(out)


# -- compare ------------------------------------------------------------------------------------
def tests_compare_text(base: list[Any], head: list[Any]) -> str:
    """The tests that ran on both sides, head against base; empty when no test did."""
    from ..analysis.tests_compare import changes_of_tests

    changes = changes_of_tests(base, head)
    if not changes:
        return ""
    costlier = [c for c in changes if c.costlier]
    n = changes[0].interval.n
    how = (f"Welch's t over {n[0]} and {n[1]} runs, never narrower than the tests' bars" if changes[0].interval.df
           is not None else "one run on a side: the tests' bars alone, which cannot see run-to-run noise")
    lines = ["", f"Tests, head against base ({len(costlier)} of {len(changes)} costlier, marked *; "
             f"{changes[0].interval.confidence * 100:g}% interval: {how}):"]
    for c in changes[:MAX_TESTS_COMPARED]:
        pct = "" if c.pct is None else f" {c.pct:+.1f}%"
        lines.append(f"  {'*' if c.costlier else ' '} {fmt_energy(c.base_j):>9} -> {fmt_energy(c.head_j):>9}{pct}"
                     f" (change {fmt_energy(c.interval.low)} to {fmt_energy(c.interval.high)})  {c.nodeid}")
    if len(changes) > MAX_TESTS_COMPARED:
        lines.append(f"  ... {len(changes) - MAX_TESTS_COMPARED} more")
    return "\n".join(lines) + "\n"
