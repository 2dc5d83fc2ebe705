"""The cost of a request's window: uvicorn serving a trivial route, plain and under `python -m energyprof`.

    python benchmarks/requests_overhead.py                 # 2000 requests a run, 3 pairs (~1 min)
    python benchmarks/requests_overhead.py --requests 500 --pairs 1

The route burns 1 ms of its own thread's CPU. A client here sends the requests one after another on one
loopback connection; the server's CPU (its /proc/PID/stat, every thread) over the load is read before
and after. Two figures:

- server CPU per request, plain and profiled, and the difference in microseconds and as a share of the
  1 ms request: everything energyprof adds to a request's process (the sampler's ticks included);
- the bookkeeping alone, in process: an ASGI call through AsgiRequests (opening, naming and closing the
  request's window into a real spool, agent/requests.py) against the bare call, per request, against 1 ms.

Runs are paired (plain, profiled; then profiled, plain; ...) after a warm-up pair that is thrown away.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = """
import os, time
from fastapi import FastAPI

app = FastAPI()

@app.get("/items/{item_id}")
async def item(item_id: int):
    start = time.thread_time()
    while time.thread_time() - start < 0.001:
        pass
    return {"id": item_id}

@app.get("/pid")
async def pid():
    return {"pid": os.getpid()}
"""
TICK = os.sysconf("SC_CLK_TCK")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _get(conn: http.client.HTTPConnection, path: str) -> bytes:
    conn.request("GET", path)
    r = conn.getresponse()
    return r.read()


def one_run(folder: Path, profiled: bool, requests: int) -> float:
    """Server CPU seconds per request over `requests` sequential requests."""
    port = _port()
    head = [sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--json", "p.json", "-o", "-"] \
        if profiled else [sys.executable]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([*head, "-m", "uvicorn", "app:app", "--port", str(port), "--log-level", "warning"],
                            cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                pid = int(_get(conn, "/pid").split(b":")[1].rstrip(b"}"))
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("the server never answered")
        for i in range(50):  # warm: the route's first calls build FastAPI's caches
            _get(conn, f"/items/{i}")
        before = _cpu_s(pid)
        for i in range(requests):
            _get(conn, f"/items/{i}")
        after = _cpu_s(pid)
        conn.close()
        return (after - before) / requests
    finally:
        proc.send_signal(2)
        proc.wait(timeout=120)


def bookkeeping_s(n: int = 20000) -> tuple[float, float, float]:
    """Seconds of the calling thread's CPU per request an ASGI request costs, plain, through AsgiRequests
    into a real spool (open, name, close a window: the supervised agent's sink), and through AsgiRequests
    into a running in-process profile: an application that routes and answers, driven without a loop."""
    sys.path.insert(0, str(ROOT))
    from energyprof.agent import requests as rq
    from energyprof.agent.spool import Spool

    async def app(scope: dict, receive: object, send: object) -> None:
        rq.name_request(rq.current(), "/items/{item_id}")  # what the routing hook does once a route matched
        await send({"type": "http.response.start", "status": 200})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]

    async def send(message: dict) -> None:
        pass

    def drive(asgi: object) -> float:
        scope = {"type": "http", "method": "GET", "path": "/items/1"}
        t0 = time.thread_time()
        for _ in range(n):
            try:
                asgi(scope, None, send).send(None)  # type: ignore[operator]
            except StopIteration:
                pass
            if len(spool.buf) > 2000:
                spool.flush()
        spool.flush()
        return (time.thread_time() - t0) / n

    with tempfile.TemporaryDirectory() as d:
        spool = Spool(os.path.join(d, "x.spool"))
        trace = os.path.join(d, "trace.csv")
        with open(trace, "w") as fh:
            fh.write("t_s,cpu\n0,50\n")
        from energyprof import energy_profile

        with energy_profile(output=None, quiet=True, power_trace=trace):  # the in-process Profiler's sink
            inproc = min(drive(rq.AsgiRequests(app)) for _ in range(3))

        class Agent:  # the spool sink needs only the agent's spool
            pass

        agent = Agent()
        agent.spool = spool  # type: ignore[attr-defined]
        sink = rq._SpoolSink(agent)
        rq._sink = lambda: sink  # the supervised agent's sink, without starting a sampler here
        plain = min(drive(app) for _ in range(3))
        wrapped = min(drive(rq.AsgiRequests(app)) for _ in range(3))
        return plain, wrapped, inproc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "app.py").write_text(textwrap.dedent(APP))
        (folder / "trace.csv").write_text("t_s,cpu\n0,50\n")
        one_run(folder, False, 100), one_run(folder, True, 100)  # warm-up pair, thrown away
        plain, prof = [], []
        for k in range(args.pairs):
            order = (False, True) if k % 2 == 0 else (True, False)
            for profiled in order:
                (prof if profiled else plain).append(one_run(folder, profiled, args.requests))
    p, q = statistics.median(plain), statistics.median(prof)
    print(f"server CPU per request (median of {args.pairs} runs of {args.requests} sequential requests, measured):")
    print(f"  plain     {p * 1e6:8.1f} us   (runs: {', '.join(f'{x * 1e6:.1f}' for x in plain)})")
    print(f"  profiled  {q * 1e6:8.1f} us   (runs: {', '.join(f'{x * 1e6:.1f}' for x in prof)})")
    print(f"  added     {(q - p) * 1e6:8.1f} us a request = {(q - p) / 1e-3 * 100:.1f}% of a 1 ms request"
          " (sampler included; /proc's CPU counts in 10 ms ticks)")
    bare, wrapped, inproc = bookkeeping_s()
    for label, t in (("into a spool (python -m energyprof)", wrapped), ("into an in-process profile", inproc)):
        b = t - bare
        print(f"bookkeeping alone, {label}: {bare * 1e6:.2f} us a bare ASGI call, {t * 1e6:.2f} us through"
              f" AsgiRequests: {b * 1e6:.2f} us a request = {b / 1e-3 * 100:.2f}% of a 1 ms request"
              " (measured, the thread's CPU, best of 3)")


if __name__ == "__main__":
    main()
