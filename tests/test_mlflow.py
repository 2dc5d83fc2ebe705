"""MLflow logging against a real local tracking store, read back with MlflowClient.

Most tests use MLflow's file store in tmp_path (opted in with MLFLOW_ALLOW_FILE_STORE, as MLflow 3
asks): it is created in milliseconds. One test runs with nothing set, against MLflow 3's default
SQLite store, which the extra's SQLAlchemy and Alembic open.
"""

from __future__ import annotations

import re

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from energyprof.analysis.carbon import CarbonSettings
from energyprof.analysis.report import RenderOptions
from energyprof.carbon.intensity import Intensity
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile
from energyprof.facts.profile import load

mlflow = pytest.importorskip("mlflow", reason="mlflow (energyprof[mlflow]) is not installed")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(uri)
    return uri


def epochs_profile() -> Profile:
    root = Node("train.py", energy_j={"cpu": 30.0}, self_energy_j={"cpu": 30.0}, time_s=3.0, samples=300)
    windows = [{"name": "epoch", "index": i, "start_s": float(i), "end_s": i + 1.0, "time_s": 1.0,
                "energy_j": {"cpu": 8.0 + i, "dram": 1.0}} for i in range(3)]
    return Profile(meta={"idle_policy": "share", "target": "train.py"},
                   sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "rapl"},
                            {"id": "dram", "component": "dram", "method": "estimated", "sensor": "model"}],
                   totals={"energy_j": {"cpu": 30.0, "dram": 3.0}, "attributed_j": {"cpu": 20.0, "dram": 2.0},
                           "duration_s": 3.0}, root=root, windows=windows)


def at_56_g() -> RenderOptions:
    """Carbon is a render option: a fixed 56 gCO2/kWh (France's grid), PUE 1."""
    return RenderOptions(carbon=CarbonSettings(intensity=Intensity(56.0, "codecarbon FRA", "country")))


KWH = 3.6e6


def test_logs_params_metrics_windows_and_artifacts(store: str) -> None:
    from energyprof.mlflow import log_profile  # the short public name

    run_id = log_profile(epochs_profile(), render=at_56_g())
    assert mlflow.active_run() is None  # the run it started is ended again
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    m = run.data.metrics
    assert m["energyprof.energy_j"] == 33.0 and m["energyprof.program_energy_j"] == 22.0
    # the program's carbon is the headline (22 J), the machine's (33 J) beside it
    assert m["energyprof.carbon_g"] == pytest.approx(22.0 / KWH * 56.0)
    assert m["energyprof.machine_carbon_g"] == pytest.approx(33.0 / KWH * 56.0)
    assert m["energyprof.duration_s"] == 3.0
    history = client.get_metric_history(run_id, "energyprof.window.epoch.energy_j")
    assert sorted((h.step, h.value) for h in history) == [(0, 9.0), (1, 10.0), (2, 11.0)]
    history = client.get_metric_history(run_id, "energyprof.window.epoch.carbon_g")
    assert sorted(h.step for h in history) == [0, 1, 2]
    assert [h.value for h in sorted(history, key=lambda h: h.step)] == pytest.approx(
        [(9.0 + i) / KWH * 56.0 for i in range(3)])
    p = run.data.params
    assert p["energyprof.source.cpu"] == "measured (rapl)" and p["energyprof.source.dram"] == "estimated (model)"
    assert p["energyprof.idle_policy"] == "share" and p["energyprof.intensity_g_per_kwh"] == "56"
    arts = {a.path for a in client.list_artifacts(run_id, "energyprof")}
    assert arts == {"energyprof/profile.json", "energyprof/report.html"}
    local = Path(client.download_artifacts(run_id, "energyprof/profile.json"))
    assert load(local).totals["attributed_j"] == {"cpu": 20.0, "dram": 2.0}


def test_logs_into_the_active_run_and_leaves_it_active(store: str) -> None:
    from energyprof.output.mlflow import log_profile

    with mlflow.start_run() as active:
        mlflow.log_param("batch_size", 32)
        assert log_profile(epochs_profile(), artifacts=False) == active.info.run_id
        assert mlflow.active_run().info.run_id == active.info.run_id
    run = mlflow.MlflowClient().get_run(active.info.run_id)
    assert run.data.params["batch_size"] == "32" and run.data.metrics["energyprof.energy_j"] == 33.0


def _supervised(tmp_path: Path, store: str, program: str, *flags: str):
    """`python -m energyprof --mlflow` on `program` against a constant 40 W trace, into `store`."""
    (tmp_path / "t.csv").write_text("t_s,cpu\n0,40\n")
    (tmp_path / "w.py").write_text(program)
    res = run_cli(["--power-trace", "t.csv", "--idle", "all", "--mlflow", "--json", "p.json", *flags, "w.py"],
                  cwd=tmp_path, env={"MLFLOW_TRACKING_URI": store, "MLFLOW_ALLOW_FILE_STORE": "true"})
    assert res.returncode == 0, res.stderr
    return res


@pytest.mark.slow
def test_cli_flag_logs_a_real_run(tmp_path: Path, store: str) -> None:
    res = _supervised(tmp_path, store, "import time\ntime.sleep(0.3)\nprint('done')\n", "-o", "r.html")
    assert res.stdout == "done\n"  # the program's output is its own
    assert "logged to MLflow run" in res.stderr
    # what the log took after the run is said, since no figure of the run holds it
    assert re.search(r"logged to MLflow run \w+ \(measured: \d+\.\d\d s, \d+\.\d\d s of energyprof's CPU after the run, "
                     r"in no figure\)", res.stderr), res.stderr
    profile = load(tmp_path / "p.json")
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.search_experiments()[0].experiment_id])
    m = run.data.metrics
    assert m["energyprof.program_energy_j"] == pytest.approx(sum(profile.totals["attributed_j"].values()))
    assert m["energyprof.energy_j"] == pytest.approx(profile.totals["energy_j"]["cpu"])
    assert run.data.params["energyprof.source.cpu"].startswith("measured")
    # the carbon logged is the report's: the program's figure, as written under "derived"
    derived = json.loads((tmp_path / "p.json").read_text())["derived"]["totals"]
    assert m["energyprof.carbon_g"] == pytest.approx(derived["carbon_g"])
    assert m["energyprof.machine_carbon_g"] == pytest.approx(derived["machine_carbon_g"])


def test_api_option_logs_into_the_users_active_run(tmp_path: Path, store: str) -> None:
    import time

    from energyprof import energy_profile

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,cpu\n0,40\n")
    with mlflow.start_run() as active:
        with energy_profile(mlflow=True, power_trace=str(trace), idle="all", quiet=True) as prof:
            for epoch in range(2):
                with prof.window("epoch", epoch):
                    time.sleep(0.05)
    profile = prof.profile
    client = mlflow.MlflowClient()
    m = client.get_run(active.info.run_id).data.metrics
    assert m["energyprof.energy_j"] == pytest.approx(profile.totals["energy_j"]["cpu"])
    history = sorted((h.step, h.value) for h in client.get_metric_history(active.info.run_id,
                                                                           "energyprof.window.epoch.energy_j"))
    expected = sorted((w["index"], sum(w["energy_j"].values())) for w in profile.windows if w["name"] == "epoch")
    assert [s for s, _ in history] == [0, 1]
    assert [v for _, v in history] == pytest.approx([v for _, v in expected])


def test_mlflow_flag_without_mlflow_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A missing optional package is bad input, found before the program starts."""
    import os

    (tmp_path / "w.py").write_text("print('ran')\n")
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None  # as if not installed\n")

    res = run_cli(["--mlflow", "w.py"], cwd=tmp_path,
                  env={"PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])})
    assert res.returncode == 2 and "ran" not in res.stdout
    assert "pip install 'energyprof[mlflow]'" in res.stderr and res.stderr.count("\n") == 1


def _until(count, want: int, wait_s: float = 60.0) -> int:
    """`count()` once it reaches `want` (energyprof's thread logs a window soon after its block ends, off
    the program's time), or what it is after `wait_s`: a bound for a loaded machine, not a timing."""
    import time

    def now() -> int:
        try:
            return count()
        except Exception as e:  # noqa: BLE001 - mlflow's file store: a metric file read while its line is written
            if "malformed" in str(e):
                return 0
            raise

    deadline = time.monotonic() + wait_s
    n = now()
    while n < want and time.monotonic() < deadline:
        time.sleep(0.02)
        n = now()
    return n


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((h.step, h.value) for h in client.get_metric_history(run_id, key))


def test_windows_are_logged_live_in_process(tmp_path: Path, store: str) -> None:
    """With no active run, the windows go to a run energyprof creates (never made active), and the
    end-of-run log lands in that same run without logging a window twice."""
    import time

    from energyprof import energy_profile

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,cpu\n0,40\n")
    client = mlflow.MlflowClient()
    seen = []
    def logged() -> int:
        runs = client.search_runs([client.search_experiments()[0].experiment_id])
        return len(client.get_metric_history(runs[0].info.run_id, "energyprof.window.epoch.energy_j")) if runs else 0

    with energy_profile(mlflow=True, power_trace=str(trace), idle="all", quiet=True) as prof:
        for epoch in range(3):
            with prof.window("epoch", epoch) as m:
                time.sleep(0.05)
            assert mlflow.active_run() is None  # the program's own start_run() would still work
            seen.append((_until(logged, epoch + 1), m.complete))
    assert seen == [(1, True), (2, True), (3, True)]  # each logged once its block ended, not at stop
    profile = prof.profile
    (run,) = client.search_runs([client.search_experiments()[0].experiment_id])  # one run, not two
    assert run.info.status == "FINISHED"
    assert run.data.metrics["energyprof.energy_j"] == pytest.approx(profile.totals["energy_j"]["cpu"])
    windows = sorted((w["index"], w) for w in profile.windows if w["name"] == "epoch")
    for key, field in (("energy_j", "energy_j"), ("program_energy_j", "program_energy_j")):
        history = _history(client, run.info.run_id, f"energyprof.window.epoch.{key}")
        assert [s for s, _ in history] == [0, 1, 2]  # one value per step: log_model skipped them
        assert [v for _, v in history] == pytest.approx([sum(w[field].values()) for _, w in windows])


def test_bare_windows_are_not_logged_live(tmp_path: Path, store: str) -> None:
    """begin_window/end_window (per-step windows) come only with the end-of-run log, once each."""
    import time

    from energyprof import energy_profile

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,cpu\n0,40\n")
    client = mlflow.MlflowClient()
    with mlflow.start_run() as active:
        with energy_profile(mlflow=True, power_trace=str(trace), idle="all", quiet=True) as prof:
            for step in range(3):
                prof.begin_window("step", step)
                time.sleep(0.02)
                prof.end_window("step")
                assert client.get_metric_history(active.info.run_id, "energyprof.window.step.energy_j") == []
    history = _history(client, active.info.run_id, "energyprof.window.step.energy_j")
    assert [s for s, _ in history] == [0, 1, 2]


LIVE_SCRIPT = """\
import time
import mlflow
import energyprof.torch
def logged():
    try:
        return len(mlflow.MlflowClient().get_metric_history(run.info.run_id, "energyprof.window.epoch.energy_j"))
    except Exception as e:  # the file store's metric file read while its line is written
        if "malformed" in str(e):
            return 0
        raise
with mlflow.start_run() as run:
    for epoch in range(3):
        with energyprof.torch.window("epoch", epoch) as m:
            time.sleep(0.1)
        deadline = time.monotonic() + 60  # the supervisor logs it once charged, off the program's time
        while logged() < epoch + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        print(epoch, logged(), m.complete)
    print(run.info.run_id)
"""


@pytest.mark.slow
def test_supervised_windows_are_logged_live_in_the_programs_run(tmp_path: Path, store: str) -> None:
    res = _supervised(tmp_path, store, LIVE_SCRIPT)
    *lines, run_id = res.stdout.split("\n")[:-1]
    assert lines == ["0 1 True", "1 2 True", "2 3 True"]  # the program saw each epoch logged once it ended
    profile = load(tmp_path / "p.json")
    windows = sorted((w["index"], w) for w in profile.windows if w["name"] == "epoch")
    client = mlflow.MlflowClient()
    # one program, one run: the program's own, holding its live windows and the supervisor's totals
    (run,) = client.search_runs([client.search_experiments()[0].experiment_id])
    assert run.info.run_id == run_id and f"logged to MLflow run {run_id}" in res.stderr
    assert run.data.metrics["energyprof.program_energy_j"] == pytest.approx(sum(profile.totals["attributed_j"].values()))
    for key in ("energy_j", "program_energy_j"):
        history = _history(client, run_id, f"energyprof.window.epoch.{key}")
        assert [s for s, _ in history] == [0, 1, 2]
        assert [v for _, v in history] == pytest.approx([sum(w[key].values()) for _, w in windows])


SUPERVISED_NO_RUN = """\
import time
import energyprof.torch
for epoch in range(2):
    with energyprof.torch.window("epoch", epoch):
        time.sleep(0.1)
print("done")
"""


@pytest.mark.slow
def test_a_supervised_program_without_a_run_of_its_own_gives_one_run(tmp_path: Path, store: str) -> None:
    """The windows (logged live in the program's process) and the totals (the supervisor's) share one run."""
    res = _supervised(tmp_path, store, SUPERVISED_NO_RUN)
    assert res.stdout == "done\n"
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.search_experiments()[0].experiment_id])
    assert run.info.status == "FINISHED"
    profile = load(tmp_path / "p.json")
    assert run.data.metrics["energyprof.energy_j"] == pytest.approx(profile.totals["energy_j"]["cpu"])
    windows = sorted((w["index"], w) for w in profile.windows if w["name"] == "epoch")
    history = _history(client, run.info.run_id, "energyprof.window.epoch.energy_j")
    assert [s for s, _ in history] == [0, 1]  # once each: the supervisor skipped what the program logged
    assert [v for _, v in history] == pytest.approx([sum(w["energy_j"].values()) for _, w in windows])


def _bare_env(tmp_path: Path, **env: str) -> dict[str, str]:
    """The environment of a user who set nothing for MLflow: its own defaults decide the store."""
    import os

    full = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE")}
    full.update(env)
    return full


@pytest.mark.slow
def test_mlflows_default_store_logs_one_run_with_nothing_set(tmp_path: Path) -> None:
    """`pip install 'energyprof[mlflow]'` and `--mlflow`, nothing else: MLflow 3's default store is
    SQLite in the working folder, which the extra's SQLAlchemy and Alembic open."""
    pytest.importorskip("sqlalchemy", reason="energyprof[mlflow] brings SQLAlchemy")
    (tmp_path / "t.csv").write_text("t_s,cpu\n0,40\n")
    (tmp_path / "w.py").write_text("import time\ntime.sleep(0.2)\n")
    res = subprocess.run([sys.executable, "-m", "energyprof", "--mlflow", "--power-trace", "t.csv", "--json", "p.json",
                          "-o", "r.html", "w.py"], cwd=tmp_path, env=_bare_env(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    uri = subprocess.run([sys.executable, "-c", "import mlflow; print(mlflow.get_tracking_uri())"], cwd=tmp_path,
                         env=_bare_env(tmp_path), capture_output=True, text=True, timeout=120).stdout.strip()
    if int(mlflow.__version__.split(".")[0]) >= 3:
        assert uri.startswith("sqlite:") and (tmp_path / "mlflow.db").is_file()
    client = mlflow.MlflowClient(tracking_uri=uri if uri.startswith("sqlite:") else (tmp_path / "mlruns").as_uri())
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1  # one program, one run
    profile = load(tmp_path / "p.json")
    assert runs[0].data.metrics["energyprof.program_energy_j"] == pytest.approx(sum(profile.totals["attributed_j"].values()))


@pytest.mark.parametrize("uri", ["default without its SQL backend", "a folder, not allowed", "under a file"])
def test_a_store_that_cannot_be_written_is_one_line_and_exit_2(tmp_path: Path, uri: str) -> None:
    """mlflow-skinny alone under MLflow's default store (SQLite, whose backend it lacks), a folder store
    MLflow 3 refuses, or a folder that cannot exist: one whole line that names the one setting that
    fixes it, and exit 2, before the program runs."""
    import os

    (tmp_path / "w.py").write_text("open('ran', 'w').close()\n")
    (tmp_path / "a-file").write_text("")
    env: dict[str, str] = {}
    fix = "set MLFLOW_TRACKING_URI to a server or a writable store"
    if uri == "under a file":
        env = {"MLFLOW_TRACKING_URI": (tmp_path / "a-file" / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}
    elif uri == "a folder, not allowed":
        if int(mlflow.__version__.split(".")[0]) < 3:
            pytest.skip("MLflow 2 opens a folder store without being asked")
        env = {"MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri()}
        fix = "MLflow 3 opens a folder store only with MLFLOW_ALLOW_FILE_STORE=true"
    else:
        if int(mlflow.__version__.split(".")[0]) < 3:
            pytest.skip("MLflow 2's default store is a folder")
        hide = tmp_path / "hide"
        hide.mkdir()
        (hide / "sitecustomize.py").write_text("import sys\nsys.modules['sqlalchemy'] = None  # mlflow-skinny alone\n")
        env = {"PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])}
        fix = "pip install 'energyprof[mlflow]' brings them"
    res = subprocess.run([sys.executable, "-m", "energyprof", "--mlflow", "w.py"], cwd=tmp_path,
                         env=_bare_env(tmp_path, **env), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "MLflow tracking store" in res.stderr and "cannot be written" in res.stderr
    assert fix in res.stderr
    # MLflow's own words are whole: the parenthesis closes on the end of its last sentence, not mid-word
    said = res.stderr[res.stderr.index("(") + 1:res.stderr.rindex(");")]
    assert said.rstrip().endswith((".", ")", "'", '"')) or len(said) < 200, said
    assert not (tmp_path / "ran").exists() and res.stdout == ""


FLAT_WINDOWS = """\
import sys
import time
import energyprof.torch
for epoch in range(3):
    with energyprof.torch.window("epoch", epoch):
        time.sleep(1.5)
print("done", "mlflow" in sys.modules)
"""


@pytest.mark.slow
def test_mlflow_costs_the_program_nothing_at_a_flat_power(tmp_path: Path, store: str) -> None:
    """The windows' logging (MLflow's import, its store) is energyprof's work, done by the supervisor: the
    program's energy at a flat replayed 40 W is the run's without --mlflow, within 10%. Under `all` the
    program pays 40 W for every second it lives, so a program that imported MLflow and opened its store
    in its own process (several seconds on a loaded machine) would pay for them; three 1.5 s windows
    keep the start-up's spread on a loaded machine well inside the margin."""
    (tmp_path / "t.csv").write_text("t_s,cpu\n0,40\n")
    (tmp_path / "w.py").write_text(FLAT_WINDOWS)
    energy = {}
    for flags in ([], ["--mlflow"]):
        res = run_cli(["--power-trace", "t.csv", "--idle", "all", "--json", "p.json", "-o", "r.html", *flags, "w.py"],
                      cwd=tmp_path, env={"MLFLOW_TRACKING_URI": store, "MLFLOW_ALLOW_FILE_STORE": "true"})
        assert res.returncode == 0 and res.stdout == "done False\n", res.stderr  # MLflow never imported in the program
        energy[bool(flags)] = sum(load(tmp_path / "p.json").totals["attributed_j"].values())
    assert energy[True] == pytest.approx(energy[False], rel=0.10), energy
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.search_experiments()[0].experiment_id])
    assert [s for s, _ in _history(client, run.info.run_id, "energyprof.window.epoch.energy_j")] == [0, 1, 2]


def test_log_metrics_reaches_the_run_the_windows_go_to(tmp_path: Path, store: str) -> None:
    """`energyprof.log_metrics` (a forecast after each epoch) lands in the program's run at its step."""
    import time

    from energyprof import energy_profile
    from energyprof import log_metrics

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,cpu\n0,40\n")
    client = mlflow.MlflowClient()
    with mlflow.start_run() as active:
        with energy_profile(mlflow=True, power_trace=str(trace), idle="all", quiet=True):
            for epoch in range(2):
                time.sleep(0.02)
                assert log_metrics({"forecast_energy_j": 100.0 + epoch}, step=epoch)
    history = _history(client, active.info.run_id, "energyprof.forecast_energy_j")
    assert history == [(0, 100.0), (1, 101.0)]
