"""The whole process tree's CPU under energyprof's defaults against plain python, on a CPU-bound training
loop (three branch modules of 1:2:4 work, SGD, one thread), with py-spy beside.

    python benchmarks/training_cost.py                    # 5 alternating rounds, 300 steps
    python benchmarks/training_cost.py --rounds 3 --steps 600
    python benchmarks/training_cost.py --model gpt2 --steps 60   # GPT-2 from its config (needs transformers)

Each round runs plain python, energyprof (defaults: the op capture on, as a training program gets it),
energyprof with the capture off (--no-gpu-kernels, so the capture's share shows apart from the sampler's)
and py-spy at 100 Hz, back to back, the order rotating. CPU seconds are the children's rusage (user +
system): the supervisor, the program, py-spy's sampler. The table gives each tool's CPU over plain
python's: the median of the rounds' ratios, with min-max; then each run's wall time, start to exit, over
plain python's in the same round (the issue's GPT-2 figure is wall time). The program's own start (importing torch) is
in every figure: that is what a user's run pays.

A whole-tree ratio is the difference of two runs, and a run's own CPU swings by several % from one run
to the next on a shared 2-core guest (more than the 8% budget at a load of 4). So each energyprof run is
also split within itself, from its profile's `machine_load` and the children's rusage, over the median
plain run of the same rounds: `agent` is energyprof's CPU inside the program (the sampler's thread, the
op capture's reads and reduction); `rest` is everything else of the tree that is not the program's
own work (the supervisor's start, ticks and report, the program interpreter's start and exit);
`program` is the program's own CPU against plain python's (what sampling does to its work: the GIL
hand-overs and caches, plus that swing).

Each run's wall time is also split by phase, from two stamps the program writes (the end of its imports
and set-up, the end of its loop): its start and imports, its loop, and its exit with energyprof's report
after it. What a run costs once (start, the op capture's first window, the report) shows apart from what
it costs per step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each program stamps the end of its imports and of its loop (perf_counter: CLOCK_MONOTONIC, one clock for
# every process), so a run's wall time splits into its start and imports, its loop, and its exit and report.
STAMP_START = """import os, time
"""
STAMP_LOOP = """_t_loop = time.perf_counter()
"""
STAMP_END = """with open(os.environ["STAMPS"], "w") as _fh:
    _fh.write(f"{_t_loop} {time.perf_counter()}")
"""

LOOP = """
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
W = 192


def branch(k):
    return nn.Sequential(*[nn.Linear(W, W) for _ in range(k)])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.one, self.two, self.four = branch(1), branch(2), branch(4)

    def forward(self, x):
        return self.one(x).sum() + self.two(x).sum() + self.four(x).sum()


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=1e-9)
x = torch.randn(256, W, requires_grad=True)
STAMP_LOOP
for _ in range(STEPS):
    opt.zero_grad()
    model(x).backward()
    opt.step()
"""

# GPT-2 from transformers' config (2 layers, no weights), Adam, one thread: the issue's second loop
GPT2 = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
torch.set_num_threads(1)
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
ids = torch.randint(0, 256, (8, 64))
STAMP_LOOP
for _ in range(STEPS):
    opt.zero_grad()
    model(ids, labels=ids).loss.backward()
    opt.step()
"""


def _split(profile: str, tree_s: float) -> tuple[float, float, float] | None:
    """(program's own CPU, energyprof's CPU inside the program, the rest of the tree) of one run, in s."""
    try:
        with open(profile) as fh:
            load = json.load(fh).get("machine_load") or {}
        prog, agent = float(load["program_cpu_s"]), float(load["energyprof_cpu_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return prog, agent, tree_s - prog - agent


def _cpu(cmd: list[str], cwd: str, walls: list[float] | None = None,
         phases: list[tuple[float, float, float]] | None = None) -> float:
    """The command's CPU (children's rusage); its wall time and (start and imports, loop, exit) appended."""
    stamps = os.path.join(cwd, "stamps")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "STAMPS": stamps})
    t1 = time.perf_counter()
    if walls is not None:
        walls.append(t1 - t0)
    if phases is not None:
        with open(stamps) as fh:
            loop, end = map(float, fh.read().split())
        phases.append((loop - t0, end - loop, t1 - end))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--model", choices=("branches", "gpt2"), default="branches")
    args = ap.parse_args()
    # What pip does at install: every module of energyprof compiled once. A source checkout run with
    # PYTHONDONTWRITEBYTECODE set compiled the agent's kernel modules in the program and the tree's in the supervisor
    # from source in every run (with the capture on, ~60 ms in the supervisor alone on GPT-2), as benchmarks/cost.py says.
    subprocess.run([sys.executable, "-m", "compileall", "-f", "-q", os.path.join(REPO, "energyprof")], check=True,
                   stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp()
    script = os.path.join(tmp, "loop.py")
    with open(script, "w") as fh:
        body = textwrap.dedent(GPT2 if args.model == "gpt2" else LOOP).replace("STEPS", str(args.steps))
        fh.write(STAMP_START + body.replace("STAMP_LOOP\n", STAMP_LOOP) + STAMP_END)
    ep = [sys.executable, "-m", "energyprof", "-q", "--json", os.path.join(tmp, "p.json")]
    tools = {"plain": [sys.executable, script], "energyprof": [*ep, script],
             "energyprof --no-gpu-kernels": [*ep, "--no-gpu-kernels", script]}
    spy = shutil.which("py-spy")
    if spy:
        tools["py-spy"] = [spy, "record", "-r", "100", "-o", os.path.join(tmp, "s.svg"), "--", sys.executable, script]
    names = list(tools)
    ratios: dict[str, list[float]] = {n: [] for n in names if n != "plain"}
    splits: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names if n.startswith("energyprof")}
    plain_s = []
    walls: dict[str, list[float]] = {n: [] for n in names}
    phases: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    wall_ratios: dict[str, list[float]] = {n: [] for n in ratios}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {}
        for n in order:
            got[n] = _cpu(tools[n], tmp, walls[n], phases[n])
            part = _split(os.path.join(tmp, "p.json"), got[n]) if n in splits else None
            if part is not None:
                splits[n].append(part)
        plain_s.append(got["plain"])
        for n in wall_ratios:
            wall_ratios[n].append(walls[n][-1] / walls["plain"][-1])
        for n in ratios:
            ratios[n].append(got[n] / got["plain"])
        print(f"round {r + 1}: " + ", ".join(f"{n} {got[n]:.2f} s" for n in names), flush=True)
    print(f"\nplain python: median {statistics.median(plain_s):.2f} s of CPU ({args.steps} steps, load {os.getloadavg()[0]:.1f})")
    for n, xs in ratios.items():
        print(f"{n:28s} {statistics.median(xs):.3f}x  (min {min(xs):.3f}, max {max(xs):.3f})")
    print("wall time over plain python's (median, min-max):")
    for n, xs in wall_ratios.items():
        print(f"{n:28s} {statistics.median(xs):.3f}x  (min {min(xs):.3f}, max {max(xs):.3f})")
    print("\nwall time by phase, s (median of the rounds; each run's phases less the same round's plain run's):")
    for n, xs in phases.items():
        med = [statistics.median(x[i] for x in xs) for i in range(3)]
        line = f"{n:28s} start and imports {med[0]:.3f}, loop {med[1]:.3f}, exit and report {med[2]:.3f}"
        if n != "plain":
            over = [statistics.median(x[i] - p[i] for x, p in zip(xs, phases["plain"])) for i in range(3)]
            line += f"  (over plain: {over[0]:+.3f}, {over[1]:+.3f}, {over[2]:+.3f})"
        print(line)
    plain = statistics.median(plain_s)
    print("\nwithin each run, over the median plain run (median of the rounds, min-max):")
    for n, parts in splits.items():
        if not parts:
            continue
        cols = []
        for label, i in (("program", 0), ("agent", 1), ("rest", 2)):
            xs = [p[i] / plain for p in parts]
            cols.append(f"{label} {statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]")
        print(f"{n:28s} " + ", ".join(cols))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
