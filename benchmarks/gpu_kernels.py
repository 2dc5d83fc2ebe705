"""What `--gpu-kernels`'s profiler costs the program, measured where this machine allows: on the CPU.

    python benchmarks/gpu_kernels.py               # 7 pairs (~1 min)
    python benchmarks/gpu_kernels.py --pairs 3 --steps 100
    python benchmarks/gpu_kernels.py --schedule 50:5      # also --gpu-kernel-steps' schedule

A small MLP trains on the CPU (batch 32, --width wide, SGD) in a fresh process, plain and under
torch.profiler with with_stack=True (the CPU activity: on a GPU the CUDA activity adds CUPTI's
own cost, not measured here), back to back, the order alternating, after one warm-up pair.
Each run times its own training loop; the table gives the median ratio with min-max, plus the
trace's size and the time to export it at exit (both grow with the run: the whole run is kept).
With --schedule EVERY:ACTIVE[:WINDOWS], a third run per round uses energyprof's scheduled capture
(`--gpu-kernel-steps`): the profiler on for ACTIVE of every EVERY steps, each window reduced in
memory as it closes (inside the timed loop, so its cost is counted; no trace is written).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import json, os, sys, time
import torch
torch.set_num_threads(1)
steps, mode, out, width = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
profiled = mode == "1"
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, width), torch.randint(0, 10, (32,))
def step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()
for _ in range(10):
    step()
prof = None
if profiled:
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CPU], with_stack=True)
    prof.start()
cap = None
if mode.startswith("steps:"):
    from torch.profiler import ProfilerActivity
    from energyprof.agent.kernel_capture import KernelCapture
    from energyprof.core.gpu_tree import KernelFold
    cap = KernelCapture(KernelFold(), activities=[ProfilerActivity.CPU], steps=mode[6:])
    cap.start()
t0 = time.perf_counter()
for _ in range(steps):
    if cap is not None:
        cap.step()
    step()
if cap is not None:
    cap.stop()
work = time.perf_counter() - t0
size = export = 0.0
if cap is not None:
    size = 0  # each cycle reduced in memory: no trace written
if prof is not None:
    prof.stop()
    t1 = time.perf_counter()
    prof.export_chrome_trace(out)
    export = time.perf_counter() - t1
    size = os.path.getsize(out)
print(json.dumps({"work_s": work, "export_s": export, "trace_bytes": size}))
'''


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_one(steps: int, mode: str, folder: str, width: int) -> dict[str, float]:
    """mode: "0" plain, "1" the whole run profiled, "steps:SPEC" energyprof's scheduled capture."""
    run_dir = tempfile.mkdtemp(dir=folder)
    out = os.path.join(run_dir, "trace.json")
    path = ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    r = subprocess.run([sys.executable, "-c", CHILD, str(steps), mode, out, str(width)], capture_output=True,
                       text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path})
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=256, help="the MLP's width: 2048 makes each step ~50x heavier")
    ap.add_argument("--schedule", default=None, metavar="EVERY:ACTIVE[:WINDOWS]", help="also time the scheduled capture")
    a = ap.parse_args()
    ratios, sizes, exports, plain, sched, sched_sizes = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as folder:
        modes = ["0", "1"] + ([f"steps:{a.schedule}"] if a.schedule else [])
        for k in range(a.pairs + 1):
            order = modes if k % 2 == 0 else modes[::-1]
            res = {m: run_one(a.steps, m, folder, a.width) for m in order}
            if k == 0:
                continue  # warm-up round
            ratios.append(res["1"]["work_s"] / res["0"]["work_s"])
            sizes.append(res["1"]["trace_bytes"])
            exports.append(res["1"]["export_s"])
            plain.append(res["0"]["work_s"])
            if a.schedule:
                sched.append(res[modes[2]]["work_s"] / res["0"]["work_s"])
                sched_sizes.append(res[modes[2]]["trace_bytes"])
    print(f"MLP (width {a.width}) on the CPU, {a.steps} steps, {a.pairs} pairs (measured)")
    print(f"  plain loop            {statistics.median(plain):.3f} s median")
    print(f"  profiled / plain      {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
    print(f"  trace per step        {statistics.median(sizes) / a.steps / 1024:.1f} KiB")
    print(f"  export at exit        {statistics.median(exports):.3f} s median "
          f"({statistics.median(exports) / a.steps * 1e3:.2f} ms per step)")
    if a.schedule:
        print(f"  scheduled {a.schedule:<11} {statistics.median(sched):.3f} [{min(sched):.3f}-{max(sched):.3f}] of plain,"
              f" {statistics.median(sched_sizes) / 1024:.0f} KiB of trace in all"
              f" (whole run: {statistics.median(sizes) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
