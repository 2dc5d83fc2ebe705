"""MLflow: log a profile's figures, per-window energies and the report to a tracking run.

    from energyprof.output.mlflow import log_profile
    log_profile(profile)            # the active run, or a new one under MLFLOW_TRACKING_URI

mlflow (`pip install 'energyprof[mlflow]'`, the light `mlflow-skinny` client is enough) is
imported only when something is logged. Everything goes to one run through `MlflowClient`, so
logging into a run other than the active one never changes which run is active.

With `mlflow=True` (`--mlflow`) each window opened with `window(...)` is logged live once its block
ends (`log_window`), never on the program's time: from a thread of energyprof's own (output/live.py;
in process its CPU is `[energyprof]`, and MLflow is imported once, as the profile starts), into the
program's active run if it had one when the block ended (the program's thread notes it), else a run
this module creates without making it active (the program's own `mlflow.start_run()` still works).
The end-of-run `log_model` then skips what was already logged to its run.

Under the supervisor the program and the supervisor are two processes, and one program must give
one run: the supervisor creates the run before the program starts (`open_run`, which also proves
the store can be written) and hands its id down in ENERGYPROF_MLFLOW_RUN. The supervisor logs the
program's windows itself once it has charged them (the program's process never imports MLflow for
energyprof; its agent writes down the program's active run in the spool). Windows go to the
program's active run if it has one (and say so on energyprof's run, tag `energyprof.program_run`),
else to energyprof's; the supervisor's totals follow the windows, and an energyprof run left
empty is deleted.

A job of several ranks with energyprof inside each (`torchrun ... -m energyprof train.py`) is one
program too, so one run: every rank's supervisor looks for the job's run (tag `energyprof.job`,
still running, started in the last JOB_RUN_MAX_AGE_S), creates it if there is none, and when two
were created at once all ranks keep the earliest and the others are deleted. A rank's windows and
totals are logged under `energyprof.rank<R>.` (its artifacts under `energyprof/rank<R>/`), and
rank 0 logs the joined job's totals and report unprefixed, then ends the run. In such a job the
windows always go to the job's run, never to a run a rank's program started itself.
"""

from __future__ import annotations

import atexit
import os
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..analysis.report import RenderOptions, ReportModel
    from ..facts.measurement import Measurement
    from ..facts.profile import Profile

PREFIX = "energyprof"
RUN_ENV = "ENERGYPROF_MLFLOW_RUN"  # the run a supervised job logs to, created by the supervisor
PROGRAM_RUN_TAG = f"{PREFIX}.program_run"  # on that run: the program's own run, where its windows went
RANK_ENV = "ENERGYPROF_MLFLOW_RANK"  # one rank of a job of several: its figures go under its own keys
JOB_TAG = f"{PREFIX}.job"  # on a job's run: what the job's ranks share (torchrun's run id, SLURM's job id)
JOB_RUN_MAX_AGE_S = 6 * 3600  # an older running run of the same job id is another job's (torchrun's default id is "none")
_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")  # what MLflow accepts in a metric or param name

# This process's live logging: the run it created for windows (None: none yet), and per run the
# (key, step) already logged there, so the end-of-run log does not log a window twice.
_live_run: str | None = None
_logged: dict[str, set[tuple[str, int]]] = {}
_named: set[str] = set()  # program runs already named on the supervised job's run


# -- what this module reads: the report model (program energy under the policy, carbon) ------------
def _model(profile: Profile, render: RenderOptions | None) -> ReportModel:
    from ..analysis.report import RenderOptions, build

    return build(profile, render if render is not None else RenderOptions())


def _key(name: str) -> str:
    return _KEY.sub("_", name)


def scope() -> str:
    """The keys' prefix in this process: `energyprof`, or `energyprof.rank<R>` for one rank of a job."""
    rank = os.environ.get(RANK_ENV, "")
    return f"{PREFIX}.rank{rank}" if rank.isdigit() else PREFIX


def params(model: ReportModel, prefix: str = PREFIX) -> dict[str, str]:
    """What the run measured and how: sources with their method, idle policy, carbon intensity."""
    out = {f"{prefix}.source.{_key(s.id)}": f"{s.method} ({s.sensor_text if s.sensor else s.component})" for s in model.sources}
    out[f"{prefix}.idle_policy"] = model.policy
    if model.carbon is not None:
        out[f"{prefix}.intensity_g_per_kwh"] = f"{model.carbon.intensity_g_per_kwh:g}"
        out[f"{prefix}.intensity_source"] = model.carbon.source
    out[f"{prefix}.estimated"] = str(any(s.method != "measured" for s in model.sources))
    return out


def metrics(model: ReportModel, prefix: str = PREFIX) -> list[tuple[str, float, int]]:
    """(key, value, step): the run's totals (step 0), then each window's energy (and carbon) at step = its index.

    carbon_g is the program's (the headline), machine_carbon_g everything the sensors measured."""
    out = [(f"{prefix}.energy_j", model.total_energy_j, 0), (f"{prefix}.program_energy_j", model.attributed_j, 0),
           (f"{prefix}.duration_s", model.duration_s, 0)]
    if model.carbon is not None:
        out += [(f"{prefix}.carbon_g", model.carbon.program_g, 0),
                (f"{prefix}.machine_carbon_g", model.carbon.machine_g, 0)]
    seen: dict[str, int] = {}
    for row in sorted(model.windows, key=lambda r: r.window.start_s):
        w = row.window
        name = _key(w.name)
        step = w.index if w.index is not None else seen.get(name, 0)  # unnumbered: in the order they ran
        seen[name] = step + 1
        out.append((f"{prefix}.window.{name}.energy_j", row.energy, step))
        if w.program_total_j is not None:  # absent from profiles written before windows held the program's share
            out.append((f"{prefix}.window.{name}.program_energy_j", w.program_total_j, step))
        if row.carbon_g is not None:
            out.append((f"{prefix}.window.{name}.carbon_g", row.carbon_g, step))
    return out


def log_profile(profile: Profile, run: Any = None, artifacts: bool = True, render: RenderOptions | None = None) -> str:
    """Log `profile` to `run` (an mlflow Run or ActiveRun, or a run id), else the active run, else a new
    one under MLFLOW_TRACKING_URI (ended again here). Returns the run id.

    The figures are the report model's under `render` (default: the run's idle policy, the world-average
    intensity). Artifacts under `energyprof/`: the profile (profile.json) and the report (report.html)."""
    return log_model(_model(profile, render), run, artifacts)


def log_model(model: ReportModel, run: Any = None, artifacts: bool = True) -> str:
    """`log_profile` for a model already built (the command line logs the model its report shows)."""
    global _live_run
    import mlflow
    from mlflow.entities import Metric, Param

    started = live = supervised = False
    prefix = scope()
    if run is None and os.environ.get(RUN_ENV):
        job = os.environ[RUN_ENV]  # one rank's figures go to the job's run, which rank 0 ends
        run, supervised = (job if prefix != PREFIX else _supervised_run(mlflow, job)), True
    if run is None:
        active = mlflow.active_run()
        if active is None and _live_run is not None:  # the run this process's windows went to
            run_id, live = _live_run, True
        else:
            if active is None:
                active, started = mlflow.start_run(), True
            run_id = active.info.run_id
    else:
        run_id = _run_id(run)
    client = mlflow.MlflowClient()
    try:
        now = int(time.time() * 1000)
        todo = metrics(model, prefix)
        done = _logged.get(run_id, set())
        if supervised:  # the program's process logged its windows live: read back what is there
            done = done | {(k, m.step) for k in {k for k, _, _ in todo if k.startswith(f"{prefix}.window.")}
                           for m in client.get_metric_history(run_id, k)}
        ms = [Metric(k, float(v), now, step) for k, v, step in todo if (k, step) not in done]
        ps = [Param(k, v) for k, v in params(model, prefix).items()]
        for i in range(0, max(len(ms), 1), 1000):  # log_batch takes at most 1000 metrics
            client.log_batch(run_id, metrics=ms[i:i + 1000], params=ps if i == 0 else [])
        if artifacts:
            _log_artifacts(client, run_id, model, prefix.replace(".", "/"))
    finally:
        if started:
            mlflow.end_run()
        if live:
            _live_run = None
            client.set_terminated(run_id)
    return run_id


def _run_id(run: Any) -> str:
    return run if isinstance(run, str) else run.info.run_id


class StoreError(Exception):
    """The tracking store cannot be used: one line, said before the program runs."""


def _store_error(mlflow: Any, exc: Exception) -> StoreError:
    """One line, never cut: MLflow's own words (its messages run over several lines: joined) and the
    one setting that fixes the store, in full."""
    uri = mlflow.get_tracking_uri()
    said = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip()) or type(exc).__name__
    scheme = uri.split(":", 1)[0] if ":" in uri else "file"
    if scheme in ("sqlite", "postgresql", "mysql", "mssql") and not _has_sql_backend():
        fix = ("mlflow-skinny lacks the SQL backend this store needs (SQLAlchemy and Alembic): "
               "pip install 'energyprof[mlflow]' brings them, or set MLFLOW_TRACKING_URI to a tracking server")
    elif scheme == "file" and "MLFLOW_ALLOW_FILE_STORE" in said:
        fix = ("MLflow 3 opens a folder store only with MLFLOW_ALLOW_FILE_STORE=true; or leave MLFLOW_TRACKING_URI"
               " unset for MLflow's default SQLite store (pip install 'energyprof[mlflow]')")
    else:
        fix = "set MLFLOW_TRACKING_URI to a server or a writable store"
    return StoreError(f"--mlflow: the MLflow tracking store {uri} cannot be written ({type(exc).__name__}: {said}); {fix}")


def _has_sql_backend() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("sqlalchemy", "alembic"))


def check_store() -> None:
    """Raise StoreError when the tracking store cannot even be opened (no backend for its URI, a
    folder that cannot exist); the supervisor's `open_run` goes further and writes a run."""
    import mlflow

    try:
        mlflow.MlflowClient().search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure here is the store's, said in one line
        raise _store_error(mlflow, exc) from None


def open_run() -> str:
    """Create the one run a supervised job logs to (not made active anywhere); StoreError if the store
    cannot be written. The program's windows and the supervisor's totals find it in ENERGYPROF_MLFLOW_RUN."""
    import mlflow
    from mlflow.tracking.fluent import _get_experiment_id  # the experiment start_run() would use

    try:
        return mlflow.MlflowClient().create_run(_get_experiment_id()).info.run_id
    except Exception as exc:  # noqa: BLE001 - any failure here is the store's, said in one line
        raise _store_error(mlflow, exc) from None


def open_job_run(job: str) -> str:
    """The one run of a job whose ranks each run energyprof: found by its tag, else created; when
    ranks created one at the same moment, every rank settles on the earliest and deletes its own.
    StoreError if the store cannot be written."""
    import mlflow
    from mlflow.tracking.fluent import _get_experiment_id

    try:
        client = mlflow.MlflowClient()
        experiment = _get_experiment_id()
        tag = _job_tag(job)

        def runs() -> list[Any]:
            since = int((time.time() - JOB_RUN_MAX_AGE_S) * 1000)
            found = client.search_runs([experiment], filter_string=f"tags.`{JOB_TAG}` = '{tag}'",
                                       order_by=["attributes.start_time ASC"], max_results=50)
            return sorted((r for r in found if r.info.status == "RUNNING" and r.info.start_time >= since),
                          key=lambda r: (r.info.start_time, r.info.run_id))

        existing = runs()
        if existing:
            return existing[0].info.run_id
        mine = client.create_run(experiment, tags={JOB_TAG: tag}).info.run_id
        first = (runs() or [None])[0]
        if first is not None and first.info.run_id != mine:
            client.delete_run(mine)
            return first.info.run_id
        return mine
    except Exception as exc:  # noqa: BLE001 - any failure here is the store's, said in one line
        raise _store_error(mlflow, exc) from None


def _job_tag(job: str) -> str:
    """The job's id as a tag value a search filter can quote whatever the launcher put in it."""
    return re.sub(r"[^A-Za-z0-9_.:@/-]", "_", job)[:200]


def _supervised_run(mlflow: Any, own: str) -> str:
    """Where a supervised job's totals go: the program's run if its windows went there (energyprof's
    own run, then empty, is deleted), else energyprof's run, ended here."""
    client = mlflow.MlflowClient()
    program = client.get_run(own).data.tags.get(PROGRAM_RUN_TAG)
    if program and program != own:
        client.delete_run(own)
        return program
    client.set_terminated(own)  # created by the supervisor, never active: end it once its totals are in
    return own


_ASK = object()  # log_window's program_run not given: the calling thread's active run


def log_window(m: Measurement, name: str, index: int | None, run: Any = None, program_run: Any = _ASK) -> str | None:
    """Log one window's Measurement at step = its index (0 when None): `energyprof.window.<name>.energy_j`
    (the machine's, all sources) and `.program_energy_j` (the program's part). To `run`, else the
    program's active run (`program_run`: its id as the program's thread saw it when the window ended,
    None for none; not given: this thread's active run), else the run this process created for its
    windows (created here, never made active).

    Live export (output/live.py) calls it from energyprof's own thread, so MLflow's work is never the
    program's. A Measurement not complete (its energy not all charged in time) is not logged: the
    end-of-run log has the final figures. Returns the run id, or None when nothing was logged."""
    total, program = m.total_j, m.program_total_j  # the first read waits for the window's figures
    if total is None or program is None or not m.complete:
        return None
    import mlflow
    from mlflow.entities import Metric

    run_id = _run_id(run) if run is not None else _window_run(mlflow, program_run)
    key, step = f"{scope()}.window.{_key(str(name))}", 0 if index is None else int(index)
    now = int(time.time() * 1000)
    pairs = [(f"{key}.energy_j", total), (f"{key}.program_energy_j", program)]
    mlflow.MlflowClient().log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in pairs])
    _logged.setdefault(run_id, set()).update((k, step) for k, _ in pairs)
    return run_id


def log_metrics(values: dict[str, float], step: int | None = None, run: Any = None, program_run: Any = _ASK) -> str:
    """Log the program's own figures (a forecast after each epoch) under `energyprof.<name>` at `step`
    (0 when None), to the run `log_window` would choose. Returns the run id."""
    import mlflow
    from mlflow.entities import Metric

    run_id = _run_id(run) if run is not None else _window_run(mlflow, program_run)
    now, at = int(time.time() * 1000), 0 if step is None else int(step)
    mlflow.MlflowClient().log_batch(run_id, metrics=[Metric(f"{scope()}.{_key(str(k))}", float(v), now, at)
                                                     for k, v in values.items()])
    return run_id


def _window_run(mlflow: Any, program_run: Any = _ASK) -> str:
    """The program's active run, else the supervised job's run, else this process's own window run, created
    (not activated) on first use. A supervised program's own run is named on the job's run, so the
    supervisor's totals go where the windows went."""
    global _live_run
    if program_run is _ASK:
        active = mlflow.active_run()
        program_run = active.info.run_id if active is not None else None
    job = os.environ.get(RUN_ENV)
    if job and scope() != PREFIX:
        return job  # one rank of a job: its windows go to the job's run, whatever run the rank started
    if program_run is not None:
        if job and program_run != job and program_run not in _named:
            mlflow.MlflowClient().set_tag(job, PROGRAM_RUN_TAG, program_run)
            _named.add(program_run)
        return program_run
    if job:
        return job
    if _live_run is None:
        from mlflow.tracking.fluent import _get_experiment_id  # the experiment start_run() would use

        _live_run = mlflow.MlflowClient().create_run(_get_experiment_id()).info.run_id
        atexit.register(_end_live_run)  # a program that never reaches log_model still ends its run
    return _live_run


def _end_live_run() -> None:
    global _live_run
    if _live_run is not None:
        import mlflow

        run_id, _live_run = _live_run, None
        try:
            mlflow.MlflowClient().set_terminated(run_id)
        except Exception:  # noqa: BLE001 - at exit, a store that is gone is not the program's error
            pass


def _log_artifacts(client: Any, run_id: str, model: ReportModel, folder: str = PREFIX) -> None:
    from ..store.files import write_text
    from ..render.registry import renderers

    table = renderers()  # the same JSON (facts + derived) and page as --json and -o
    with tempfile.TemporaryDirectory(prefix="energyprof-mlflow-") as tmp:
        for name, key in (("profile.json", "json"), ("report.html", "output")):
            write_text(str(Path(tmp) / name), table[key](model))
        client.log_artifacts(run_id, tmp, artifact_path=folder)
