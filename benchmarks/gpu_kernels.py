"""What `--gpu-kernels`'s profiler costs the program, measured where this machine allows: on the CPU.

    python benchmarks/gpu_kernels.py               # 7 pairs (~1 min)
    python benchmarks/gpu_kernels.py --pairs 3 --steps 100

A small MLP trains on the CPU (batch 32, --width wide, SGD) in a fresh process, plain and under
torch.profiler with with_stack=True (the CPU activity: on a GPU the CUDA activity adds CUPTI's
own cost, not measured here), back to back, the order alternating, after one warm-up pair.
Each run times its own training loop; the table gives the median ratio with min-max, plus the
trace's size and the time to export it at exit (both grow with the run: the whole run is kept).
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
steps, profiled, out, width = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])
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
t0 = time.perf_counter()
for _ in range(steps):
    step()
work = time.perf_counter() - t0
size = export = 0.0
if prof is not None:
    prof.stop()
    t1 = time.perf_counter()
    prof.export_chrome_trace(out)
    export = time.perf_counter() - t1
    size = os.path.getsize(out)
print(json.dumps({"work_s": work, "export_s": export, "trace_bytes": size}))
'''


def run_one(steps: int, profiled: bool, folder: str, width: int) -> dict[str, float]:
    out = os.path.join(folder, "trace.json")
    r = subprocess.run([sys.executable, "-c", CHILD, str(steps), "1" if profiled else "0", out, str(width)], capture_output=True,
                       text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=256, help="the MLP's width: 2048 makes each step ~50x heavier")
    a = ap.parse_args()
    ratios, sizes, exports, plain = [], [], [], []
    with tempfile.TemporaryDirectory() as folder:
        for k in range(a.pairs + 1):
            order = (False, True) if k % 2 == 0 else (True, False)
            res = {p: run_one(a.steps, p, folder, a.width) for p in order}
            if k == 0:
                continue  # warm-up pair
            ratios.append(res[True]["work_s"] / res[False]["work_s"])
            sizes.append(res[True]["trace_bytes"])
            exports.append(res[True]["export_s"])
            plain.append(res[False]["work_s"])
    print(f"MLP (width {a.width}) on the CPU, {a.steps} steps, {a.pairs} pairs (measured)")
    print(f"  plain loop            {statistics.median(plain):.3f} s median")
    print(f"  profiled / plain      {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
    print(f"  trace per step        {statistics.median(sizes) / a.steps / 1024:.1f} KiB")
    print(f"  export at exit        {statistics.median(exports):.3f} s median "
          f"({statistics.median(exports) / a.steps * 1e3:.2f} ms per step)")


if __name__ == "__main__":
    main()
