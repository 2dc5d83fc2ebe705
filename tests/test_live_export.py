"""Live export to real InfluxDB 1.x and Prometheus pushgateway servers started on loopback (tests/live_servers.py),
and to dead ones: a closed port, and a server that accepts and never answers.

Known answers: a replayed flat 40 W trace under `--idle all`; the last point's program energy, summed over
the sources, is the profile's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from energyprof.facts.profile import load
from energyprof import log_metrics
from energyprof.output.live import export, formats, sinks
from energyprof.setup import targets
from test_inprocess import SOURCES, job

pytest_plugins = ("live_servers",)  # the servers' fixtures: influx, pushgateway, closed_port, silent_server

PROGRAM = """\
import time
import energyprof.torch
t = time.perf_counter()
while time.perf_counter() - t < 0.3:
    pass
for epoch in range(2):
    with energyprof.torch.window("epoch", epoch):
        time.sleep(0.6)
print("done", flush=True)
"""


def _run(tmp_path: Path, *flags: str, program: str = PROGRAM, env: dict[str, str] | None = None):
    (tmp_path / "t.csv").write_text("t_s,cpu,dram\n0,40,5\n")
    (tmp_path / "w.py").write_text(program)
    res = run_cli(["--power-trace", "t.csv", "--idle", "all", "--json", "p.json", "-o", "r.html", *flags, "w.py"],
                  cwd=tmp_path, env=env)
    return res, (load(tmp_path / "p.json") if (tmp_path / "p.json").exists() else None)


def _program_j(profile) -> float:
    return sum(profile.totals["attributed_j"].values())


def test_a_run_under_influx_leaves_its_points(tmp_path: Path, influx) -> None:
    res, profile = _run(tmp_path, "--influx", influx.url)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "done\n"
    run = profile.meta["live_export"]["run"]
    assert all(s["dropped"] == 0 and s["sent"] > 0 for s in profile.meta["live_export"]["sinks"])
    rows = influx.rows(f"SELECT * FROM energyprof WHERE \"run\" = '{run}'")
    assert {r["source"] for r in rows} == {"cpu", "dram"}
    assert all(r["host"] == profile.meta["live_export"]["host"] for r in rows)
    by_source = {s: sorted((r for r in rows if r["source"] == s), key=lambda r: r["time"]) for s in ("cpu", "dram")}
    assert all(len(v) >= 2 for v in by_source.values())  # about once a second, then the final point
    # the last point's cumulative program energy, summed over sources, is the profile's
    last = sum(v[-1]["program_energy_joules"] for v in by_source.values())
    assert last == pytest.approx(_program_j(profile), rel=1e-9)
    assert by_source["cpu"][-1]["machine_energy_joules"] == pytest.approx(profile.totals["energy_j"]["cpu"], rel=1e-9)
    # cumulative energy never steps back, and the power is the replayed 40 W wherever a second was charged
    for v in by_source.values():
        energies = [r["machine_energy_joules"] for r in v]
        assert energies == sorted(energies)
    assert [r["machine_power_watts"] for r in by_source["cpu"]] == pytest.approx([40.0] * len(by_source["cpu"]))
    # the last point says the run's last power (a "last power" panel ends at 40 W, not at 0 W)
    assert by_source["cpu"][-1]["program_power_watts"] > 20.0
    assert all(r["method"] == "measured" for r in rows)
    # each window as it ended: the profile's figures
    windows = influx.rows(f"SELECT * FROM energyprof_window WHERE \"run\" = '{run}'")
    got = sorted((r["window"], r["index"], r["source"], r["machine_energy_joules"], r["program_energy_joules"])
                 for r in windows)
    want = sorted((w["name"], float(w["index"]), sid, w["energy_j"][sid], w["program_energy_j"][sid])
                  for w in profile.windows for sid in w["energy_j"])
    assert [g[:3] for g in got] == [w[:3] for w in want]
    assert [x for g in got for x in g[3:]] == pytest.approx([x for w in want for x in w[3:]])  # flat: approx takes no nesting
    # carbon at the end: the program's energy at the run's intensity
    carbon = influx.rows(f"SELECT * FROM energyprof_carbon WHERE \"run\" = '{run}'")
    assert {r["source"] for r in carbon} == {"cpu", "dram"}
    g = carbon[0]["intensity_g_per_kwh"]
    assert sum(r["program_grams"] for r in carbon) == pytest.approx(_program_j(profile) / 3.6e6 * g)


def test_a_run_under_pushgateway_leaves_its_metrics(tmp_path: Path, pushgateway) -> None:
    res, profile = _run(tmp_path, "--pushgateway", pushgateway.url)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "done\n"
    run = profile.meta["live_export"]["run"]
    samples = [(n, lab, v) for n, lab, v in pushgateway.scrape() if lab.get("run") == run]
    energy = {lab["source"]: v for n, lab, v in samples if n == "energyprof_program_energy_joules"}
    assert set(energy) == {"cpu", "dram"}
    assert sum(energy.values()) == pytest.approx(_program_j(profile), rel=1e-9)
    labels = next(lab for n, lab, v in samples if n == "energyprof_machine_power_watts")
    assert labels["job"] == "energyprof" and labels["instance"] == profile.meta["live_export"]["host"]
    assert {n for n, _, _ in samples} >= {"energyprof_machine_power_watts", "energyprof_program_power_watts",
                                          "energyprof_machine_energy_joules", "energyprof_window_machine_energy_joules",
                                          "energyprof_carbon_program_grams"}
    last = max(w["index"] for w in profile.windows if w["name"] == "epoch")
    index = {lab["source"]: v for n, lab, v in samples if n == "energyprof_window_index" and lab["window"] == "epoch"}
    assert set(index.values()) == {float(last)}  # the window that ended last


def test_the_api_and_log_metrics_send_to_influx(tmp_path: Path, influx) -> None:
    from energyprof import energy_profile

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,cpu\n0,40\n")
    with energy_profile(influx=influx.url, power_trace=str(trace), idle="all", quiet=True) as prof:
        for epoch in range(2):
            with prof.window("epoch", epoch):
                time.sleep(0.3)
            assert log_metrics({"forecast_energy_j": 10.0 + epoch}, step=epoch)
    profile = prof.profile
    run = profile.meta["live_export"]["run"]
    rows = influx.rows(f"SELECT last(program_energy_joules) FROM energyprof WHERE \"run\" = '{run}' GROUP BY \"source\"")
    assert sum(r["last"] for r in rows) == pytest.approx(_program_j(profile), rel=1e-9)
    metrics = influx.rows(f"SELECT * FROM energyprof_metric WHERE \"run\" = '{run}'")
    assert sorted((r["step"], r["forecast_energy_j"]) for r in metrics) == [("0", 10.0), ("1", 11.0)]
    assert {r["method"] for r in metrics} == {"estimated"}  # a forecast is an estimate, and says so
    assert len(influx.rows(f"SELECT * FROM energyprof_window WHERE \"run\" = '{run}'")) == 2
    assert not log_metrics({"x": 1.0})  # the run is over: nowhere to send
    # docs/grafana-energyprof.json: every panel's query reads this run's points
    dash = json.loads((Path(__file__).parent.parent / "docs" / "grafana-energyprof.json").read_text())
    for panel in dash["panels"]:
        q = panel["targets"][0]["query"]
        q = q.replace("$host", ".*").replace("$run", re.escape(run)).replace("$timeFilter", "time > now() - 10m")
        assert influx.query(q.replace("$__interval", "1s")), panel["title"]


def test_a_supervised_programs_log_metrics_reach_the_sinks(tmp_path: Path, influx) -> None:
    program = ("import time\nfrom energyprof import log_metrics\n"
               "for e in range(2):\n    time.sleep(0.2)\n    print(log_metrics({'forecast_energy_j': 5.0 * (e + 1)}, step=e))\n")
    res, profile = _run(tmp_path, "--influx", influx.url, program=program)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "True\nTrue\n"
    run = profile.meta["live_export"]["run"]
    metrics = influx.rows(f"SELECT * FROM energyprof_metric WHERE \"run\" = '{run}'")
    assert sorted((r["step"], r["forecast_energy_j"]) for r in metrics) == [("0", 5.0), ("1", 10.0)]
    assert {r["method"] for r in metrics} == {"estimated"}


def test_a_monitor_sends_its_windows_and_figures(tmp_path: Path, pushgateway) -> None:
    from energyprof import Monitor

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,cpu\n0,40\n")
    mon = Monitor(power_trace=str(trace), idle="all", pushgateway=pushgateway.url)
    with mon.window("epoch", 0) as m:
        time.sleep(0.3)
    total = mon.measure()
    mon.close()
    run = mon.live_summary["run"]
    assert mon.live_summary["sinks"][0]["dropped"] == 0
    samples = [(n, lab, v) for n, lab, v in pushgateway.scrape() if lab.get("run") == run]
    window = {n: v for n, lab, v in samples if lab.get("window") == "epoch"}
    assert window["energyprof_window_machine_energy_joules"] == pytest.approx(m.total_j)
    energy = {lab["source"]: v for n, lab, v in samples if n == "energyprof_program_energy_joules"}
    assert sum(energy.values()) >= total.program_total_j  # the last point is at close, after measure()


@pytest.mark.parametrize("dead", ["closed port", "accepts and never answers"])
def test_a_dead_server_costs_the_program_nothing(tmp_path: Path, dead: str, closed_port: str, silent_server) -> None:
    url = closed_port if dead == "closed port" else silent_server.url
    (tmp_path / "w.py").write_text(PROGRAM)
    plain = subprocess.run([sys.executable, "w.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    res, profile = _run(tmp_path, "--influx", f"{url}/energy", "--pushgateway", url)
    assert plain.returncode == 0
    assert (res.stdout, res.returncode) == (plain.stdout, plain.returncode)  # byte-equal output, same exit status
    sent = profile.meta["live_export"]["sinks"]
    assert [s["sink"] for s in sent] == ["influx", "pushgateway"]
    for s in sent:  # every point dropped and counted, and why
        assert s["sent"] == 0 and s["dropped"] > 0 and s["error"]
    assert sum(1 for n in profile.notes if n.kind == "live-export") == 1
    lines = [line for line in res.stderr.splitlines() if "live export" in line]
    assert len(lines) == 1 and "dropped" in lines[0]
    if dead != "closed port":
        assert silent_server.accepted >= 1  # it was reached, and never answered: the sends timed out
    # The run's end waited at most FINISH_WAIT_S for the servers, and the program's own time holds no send:
    # its CPU (the profile's, the sends are energyprof's) is what a plain run's loop costs, not a timeout's worth.
    assert export.FINISH_WAIT_S <= 1.0 and sinks.SEND_TIMEOUT_S <= 1.0


def test_bad_urls_are_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text("open('ran', 'w').close()\n")
    for flags in (["--influx", "ftp://x/db"], ["--influx", "http://127.0.0.1:8086"], ["--pushgateway", "nohost"],
                  ["--influx", "http://127.0.0.1:8086?org=o&bucket=b"]):
        res = run_cli([*flags, "w.py"], cwd=tmp_path, env={"INFLUX_TOKEN": ""})
        assert res.returncode == 2 and res.stderr.count("\n") == 1, (flags, res.stderr)
        assert flags[0] in res.stderr
    assert not (tmp_path / "ran").exists()


def test_influx_2_requests_carry_org_bucket_and_token() -> None:
    t = targets.influx_target("http://h:8086?org=acme&bucket=power", {"INFLUX_TOKEN": "s3cret"})
    assert (t.version, t.host, t.port) == (2, "h", 8086)
    assert t.path == "/api/v2/write?org=acme&bucket=power&precision=ns"
    assert t.headers == {"Authorization": "Token s3cret"}
    t = targets.influx_target("https://h/api/v2/write", {"INFLUX_TOKEN": "k", "INFLUX_ORG": "o", "INFLUX_BUCKET": "b"})
    assert (t.scheme, t.port, t.path) == ("https", 8086, "/api/v2/write?org=o&bucket=b&precision=ns")
    t = targets.influx_target("http://h:8086/my db", {})
    assert (t.version, t.path, t.headers) == (1, "/write?db=my%20db&precision=ns", {})


def test_line_protocol_and_exposition_escape_names() -> None:
    p = formats.Point("energyprof_window", {"host": "h", "run": "r", "source": "cpu", "window": "a b,c=d"},
                   {"seconds": 1.5, "nan": float("nan")}, 7)
    assert formats.line_protocol(p) == r"energyprof_window,host=h,run=r,source=cpu,window=a\ b\,c\=d seconds=1.5 7"
    text = formats.exposition({("energyprof_window_seconds", (("window", 'say "hi"\n'),)): 2.0})
    assert text == '# TYPE energyprof_window_seconds gauge\nenergyprof_window_seconds{window="say \\"hi\\"\\n"} 2.0\n'


def test_a_full_buffer_drops_its_oldest_and_the_end_gives_up_at_its_deadline() -> None:
    """The bounded buffer: a sink stuck in a request holds nothing up; what overflows is counted, and so is
    what the end's deadline leaves (the request in flight included)."""
    import threading

    class Stuck:  # a server that never answers, as the sink's thread sees it
        kind, url = "stuck", ""

        def __init__(self) -> None:
            self.entered, self.release = threading.Event(), threading.Event()

        def send(self, items, timeout):
            self.entered.set()
            self.release.wait(30)
            return len(items)

    sink = Stuck()
    ch = sinks.Channel(sink, capacity=4)
    ch.put([0])
    assert sink.entered.wait(30)  # the thread took item 0 and is stuck sending it
    ch.put(range(1, 11))  # ten more into a buffer of four: 1-6 dropped, 7-10 held
    assert (ch.dropped, list(ch.items)) == (6, [7, 8, 9, 10])
    ch.close(time.monotonic() + 0.05)
    assert (ch.sent, ch.dropped) == (0, 11)  # the four held and the one in flight, given up at the deadline
    ch.put([11])
    assert ch.dropped == 12  # after the end, nothing is taken
    sink.release.set()


def test_live_carbon_is_the_reports_and_every_point_says_its_method(tmp_path: Path, influx) -> None:
    """An intensity time series (123 g/kWh all along): the live windows' and the end's grams are the
    report's (analysis/carbon.py's arithmetic, not one world-average figure), and every point is tagged
    measured or estimated (the replayed trace is measured; carbon, an intensity's estimate, is estimated)."""
    from energyprof.analysis.report import RenderOptions
    from energyprof.analysis.report import build
    from energyprof.output.writer import carbon_settings
    from energyprof.setup.options import Options

    (tmp_path / "g.csv").write_text("timestamp,g_per_kwh\n2020-01-01T00:00:00Z,123\n")
    res, profile = _run(tmp_path, "--influx", influx.url, "--carbon-intensity-trace", "g.csv", "--pue", "1.5")
    assert res.returncode == 0, res.stderr
    run = profile.meta["live_export"]["run"]
    model = build(profile, RenderOptions(carbon=carbon_settings(Options(carbon_intensity_trace=str(tmp_path / "g.csv"),
                                                                        pue=1.5))))
    c = model.carbon
    assert c is not None and c.intensity_g_per_kwh == pytest.approx(123.0)
    # each window: the report's row (the machine's carbon) and the program's at the report's figures
    rows = influx.rows(f"SELECT * FROM energyprof_window WHERE \"run\" = '{run}'")
    got: dict[int, list[float]] = {}
    for r in rows:
        g = got.setdefault(int(r["index"]), [0.0, 0.0])
        g[0] += r["machine_carbon_grams"]
        g[1] += r["program_carbon_grams"]
    want = {int(r.window.index): [r.carbon_g, c.grams(r.window.program_energy_j)] for r in model.windows}
    assert sorted(got) == sorted(want) == [0, 1]
    for i in want:
        assert got[i] == pytest.approx(want[i], rel=1e-9)
    # the end: the report's carbon, per source and in all
    end = influx.rows(f"SELECT * FROM energyprof_carbon WHERE \"run\" = '{run}'")
    assert sum(r["program_grams"] for r in end) == pytest.approx(c.program_g, rel=1e-12)
    assert sum(r["machine_grams"] for r in end) == pytest.approx(c.machine_g, rel=1e-12)
    assert [r["intensity_g_per_kwh"] for r in end] == pytest.approx([123.0] * len(end))
    # measured or estimated, on every point
    figures = influx.rows(f"SELECT * FROM energyprof WHERE \"run\" = '{run}'")
    assert figures and {r["method"] for r in figures + rows} == {"measured"}
    assert {r["method"] for r in end} == {"estimated"}


@settings(max_examples=30, deadline=None)
@given(job(), st.sampled_from(["share", "all"]))
def test_the_live_figures_are_the_ledgers_program_energy(data, policy) -> None:
    """Mid-run (a tick still held for its samples), the once-a-second point's program energy is the ledger's
    own figure (`Ledger.program_energy`, the processes table's sum), read through its public methods."""
    from types import SimpleNamespace

    from energyprof.core.ledger import Ledger
    from energyprof.core.processes import process_table

    table, ticks, samples = data
    led = Ledger(SOURCES, table, cpus=2)
    led.note_process(10, role="main", parent_pid=1, command="python x.py")
    led.note_process(11, role="child", parent_pid=10, command="python x.py")
    for s in samples:
        led.add_sample(s)
    for tk in ticks:
        led.add_tick(tk)
    run = export.LiveExport(SimpleNamespace(), host="h", run="r")
    sent: list = []
    run.emit = sent.extend  # type: ignore[method-assign]  # no server: the points as they would go
    try:
        export.LedgerWatch(run, led, policy)._figures()
    finally:
        run.finish(wait_s=0.0)
    rows = process_table(led, policy)
    want = led.program_energy(policy)
    for i, sid in enumerate(led.source_ids):
        assert want[i] == pytest.approx(sum(r["energy_j"][sid] for r in rows), abs=1e-9)
    if led.charged_ns is not None and led.charged_ns > (led.first_ns or 0):
        got = {p.tags["source"]: p.fields["program_energy_joules"] for p in sent}
        assert got == {sid: pytest.approx(want[i], abs=1e-12) for i, sid in enumerate(led.source_ids)}
        assert {p.tags["method"] for p in sent} == {"measured"}


SECRET = "S3cret&p=x"  # the influx_auth fixture's admin password; `&` and `=` quoted in a URL


@pytest.mark.parametrize("form", ["query", "userinfo"])
def test_an_influx_1_login_is_sent_and_never_written_down(tmp_path: Path, influx_auth, form: str) -> None:
    """A real influxd with auth-enabled: the login in the URL (?u=&p=, or USER:PASSWORD@) gets the points
    written, and the password is in none of the profile, the page, stdout or stderr."""
    from urllib.parse import quote

    host = f"127.0.0.1:{influx_auth.port}"
    url = (f"http://{host}/energy?u=admin&p={quote(SECRET, safe='')}" if form == "query"
           else f"http://admin:{quote(SECRET, safe='')}@{host}/energy")
    res, profile = _run(tmp_path, "--influx", url)
    assert res.returncode == 0, res.stderr
    sinks = profile.meta["live_export"]["sinks"]
    assert sinks[0]["sent"] > 0 and sinks[0]["dropped"] == 0, sinks
    assert "***" in sinks[0]["url"] and "admin" not in sinks[0]["url"]
    run = profile.meta["live_export"]["run"]
    assert influx_auth.rows(f"SELECT * FROM energyprof WHERE \"run\" = '{run}'")
    written = [(tmp_path / "p.json").read_bytes(), (tmp_path / "r.html").read_bytes(), res.stdout.encode(),
               res.stderr.encode()]
    for text in (SECRET, quote(SECRET, safe=""), "S3cret"):
        assert not any(text.encode() in w for w in written), text
    assert not any(SECRET in a or "S3cret" in a for a in profile.meta["argv"])


def test_a_wrong_influx_login_loses_the_points_and_says_so_without_it(tmp_path: Path, influx_auth) -> None:
    url = f"http://127.0.0.1:{influx_auth.port}/energy?u=admin&p=Wr0ngPassw0rd"
    res, profile = _run(tmp_path, "--influx", url)
    assert res.returncode == 0 and res.stdout == "done\n"
    sink = profile.meta["live_export"]["sinks"][0]
    assert sink["sent"] == 0 and sink["dropped"] > 0 and "401" in sink["error"]
    for where in ((tmp_path / "p.json").read_text(), (tmp_path / "r.html").read_text(), res.stderr):
        assert "Wr0ngPassw0rd" not in where


def test_influx_1_logins_go_in_a_header_and_bad_ones_are_one_line() -> None:
    t = targets.influx_target("http://h:8086/db?u=ad%20min&p=p%26w", {"INFLUX_TOKEN": "tok"})
    assert (t.version, t.path) == (1, "/write?db=db&precision=ns")  # no credential in the request line
    assert t.headers == {"Authorization": "Basic " + __import__("base64").b64encode(b"ad min:p&w").decode()}
    t = targets.influx_target("http://u%40x:pw@h/db", {})
    assert t.headers["Authorization"] == "Basic " + __import__("base64").b64encode(b"u@x:pw").decode()
    for url in ("http://h/db?u=admin", "http://h/db?p=pw", "http://h?org=o&bucket=b&u=a&p=pw",
                "http://a:pw@h/db?u=a&p=pw"):
        with pytest.raises(targets.TargetError) as err:
            targets.influx_target(url, {"INFLUX_TOKEN": "t"})
        assert "pw" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(targets.TargetError, match="no credentials"):
        targets.pushgateway_target("http://a:pw@h:9091")


@given(st.text(min_size=1, max_size=20).filter(lambda x: x.strip()), st.sampled_from(["query", "userinfo", "token"]))
def test_a_redacted_url_holds_no_credential(secret: str, form: str) -> None:
    from urllib.parse import parse_qsl, quote, urlsplit

    q = quote(secret, safe="")
    url = {"query": f"http://h:8086/db?u={q}&p={q}&rp=x", "userinfo": f"https://{q}:{q}@h/db",
           "token": f"http://h?org=o&bucket=b&token={q}"}[form]
    shown = targets.redacted(url)
    parts = urlsplit(shown)
    assert parts.hostname == "h" and parts.password in (None, "***") and parts.username in (None, "***")
    secrets = {k: v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k in ("u", "p", "token")}
    assert set(secrets.values()) <= {"***"} and "***" in shown
    assert {k: v for k, v in parse_qsl(parts.query) if k not in secrets} == (
        {"rp": "x"} if form == "query" else {"org": "o", "bucket": "b"} if form == "token" else {})
    argv = ["--influx", url, f"--pushgateway={url}", "--infl", url, "w.py"]
    assert targets.redacted_argv(argv, [url, url]) == ["--influx", shown, f"--pushgateway={shown}", "--infl", shown, "w.py"]


def test_credentials_in_a_bad_target_are_one_line_exit_2_and_never_shown(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text("open('ran', 'w').close()\n")
    for flags in (["--influx", "http://127.0.0.1:8086/db?u=admin"],
                  ["--influx", "http://127.0.0.1:8086?org=o&bucket=b&u=admin&p=Sekrit99"],
                  ["--pushgateway", "http://admin:Sekrit99@127.0.0.1:9091"]):
        res = run_cli([*flags, "w.py"], cwd=tmp_path, env={"INFLUX_TOKEN": "tok"})
        assert res.returncode == 2 and res.stderr.count("\n") == 1, (flags, res.stderr)
        assert "Sekrit99" not in res.stderr
    assert not (tmp_path / "ran").exists()


def test_an_extra_point_source_is_sent_with_the_figures() -> None:
    """`add_point_source`: another module's points go out once a period and at the end, tagged as any."""
    from types import SimpleNamespace

    run = export.LiveExport(SimpleNamespace(), host="h", run="r")
    sent: list = []
    run.emit = sent.extend  # type: ignore[method-assign]
    calls: list[int] = []

    def requests(wall_ns: int) -> list:
        calls.append(wall_ns)
        return [formats.Point("energyprof_requests", run.tags("all", route="/x"), {"count": float(len(calls))}, wall_ns)]

    def broken(wall_ns: int) -> list:
        raise RuntimeError("no figures")

    run.add_point_source(requests)
    run.add_point_source(broken)
    run.poll_point_sources(5)
    summary = run.finish(totals=({"cpu": 1.0}, {"cpu": 0.5}), end_ns=10, wait_s=0.0)
    assert calls == [5, 10]
    counts = [p for p in sent if p.measurement == "energyprof_requests"]
    assert [p.fields["count"] for p in counts] == [1.0, 2.0] and counts[0].tags["method"] == "measured"
    assert summary["point_source_errors"] == ["RuntimeError: no figures"]
