"""The GPU checks of the kernel capture (docs/gpu.md), for a machine with an NVIDIA GPU and nvidia-ml-py.

    python benchmarks/gpu_step.py                  # all three jobs (~10 min on an H100/H200)
    python benchmarks/gpu_step.py --only phases    # phases | chain | gpt2
    python benchmarks/gpu_step.py --gpt2-steps 200 --long-steps 2000

Each job runs in a fresh process under `python -m energyprof` (and GPT-2 also plain), and the
program reads the driver's energy counter (`nvmlDeviceGetTotalEnergyConsumption`) itself at
synchronised edges, so each figure is checked against a known answer. Printed, each beside its
target:

1. phases: a compute-bound phase (bf16 8192^3 matmuls, ~4 s), a memory-bound one (1 GiB
   multiplies, ~4 s) and a rest (~3 s), each launched by its own function, with `--gpu-kernels`:
   each function's GPU joules against the counter's delta over its phase (within 3%), with its
   error bar (under 10%, and holding the true error);
2. chain: 8 equal matmuls (one line), `loss.backward()`, 60 steps through energyprof.torch.track:
   the `backward()` frame's GPU joules over the forward line's (2.0x +-10%), and the share of
   backward's joules beneath the forward line (at least 95%);
3. gpt2: GPT-2 small from transformers' config (no weights, bf16, batch 16 x 1024) for N steps,
   plain, under the default run (the capture on by default on a schedule), and with whole-run
   capture (`--gpu-kernels`): steps/s against plain (schedule within 1%, whole run within 2%),
   the wall time (whole run within plain + 3 s), the share of kernel joules on the program's
   stacks (at least 95%, none at the top), forward to backward (1:1.5 to 1:2.6); and over
   `--long-steps` steps with whole-run capture, the kernel fold's size and the program's peak RSS
   against the N-step run's (bounded).
Skipped with a line when there is no CUDA GPU, or (GPT-2) when transformers is not importable.
Never changes the GPU's settings (power limit, clocks, MIG): it reads them only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMON = r'''
import json, os, sys, time
import torch

def counter_j():
    """The driver's energy counter of device 0, in joules, after the GPU's queued work is done."""
    torch.cuda.synchronize()
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("BENCH_NVML_INDEX", "0")))
    return pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0

def save(out, **figures):
    with open(out, "w") as fh:
        json.dump(figures, fh)
'''

PHASES = COMMON + r'''
out = sys.argv[1]
dev = torch.device("cuda")

def compute_phase(seconds):
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            a @ b
        sync()

def memory_phase(seconds):
    x = torch.randn(256 * 1024 * 1024, device=dev)  # 1 GiB of float32
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            x.mul_(1.0000001)
        sync()

def rest_phase(seconds):
    time.sleep(seconds)

def sync():
    torch.cuda.synchronize()

edges = {}
for name, fn, s in (("compute_phase", compute_phase, 4.0), ("memory_phase", memory_phase, 4.0),
                    ("rest_phase", rest_phase, 3.0)):
    e0 = counter_j()
    fn(s)
    edges[name] = counter_j() - e0
save(out, counter_j=edges)
'''

CHAIN = COMMON + r'''
import energyprof.torch as ept
out, steps = sys.argv[1], int(sys.argv[2])
dev = torch.device("cuda")
n = 4096
ws = [torch.randn(n, n, device=dev, requires_grad=True) for _ in range(8)]

def forward(h):
    for w in ws:
        h = h @ w  # the forward line: 8 equal matmuls
    return h

def train_step(x):
    loss = forward(x).square().mean()
    loss.backward()  # the backward() line: twice the forward's work (a grad for h and one for w)
    for w in ws:
        w.grad = None

x = torch.randn(n, n, device=dev, requires_grad=True)
e0 = counter_j()
for _ in ept.track(list(range(steps))):
    train_step(x)
save(out, counter_j=counter_j() - e0)
'''

GPT2 = COMMON + r'''
import energyprof.torch as ept
from transformers import GPT2Config, GPT2LMHeadModel
out, steps = sys.argv[1], int(sys.argv[2])
dev = torch.device("cuda")
model = GPT2LMHeadModel(GPT2Config()).to(dev, dtype=torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
tokens = torch.randint(0, 50257, (16, 1024), device=dev)

def train_step():
    loss = model(tokens, labels=tokens).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

for _ in range(5):
    train_step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    train_step()
torch.cuda.synchronize()
save(out, steps_per_s=steps / (time.perf_counter() - t0))
'''


def run(script: str, args: list[str], energyprof: list[str] | None, folder: str, tag: str) -> dict[str, Any]:
    """One fresh process: plain python, or under energyprof with these flags; its figures, its
    profile (when profiled) and its wall time."""
    path = os.path.join(folder, f"{tag}.py")
    with open(path, "w") as fh:
        fh.write(script)
    figures = os.path.join(folder, f"{tag}.figures.json")
    profile = os.path.join(folder, f"{tag}.profile.json")
    cmd = [sys.executable, path, figures, *args]
    if energyprof is not None:
        cmd = [sys.executable, "-m", "energyprof", *energyprof, "-q", "--json", profile, path, figures, *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{tag} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    with open(figures) as fh:
        out = {"figures": json.load(fh), "wall_s": wall, "stderr": r.stderr}
    if energyprof is not None:
        from energyprof.facts.profile import load

        out["profile"] = load(profile)
    return out


def gpu_j(node: Any) -> float:
    return sum(v for k, v in node.energy_j.items() if k.startswith("gpu:"))


def find(profile: Any, function: str, under_backward: bool | None = None) -> list[Any]:
    """Nodes named `function` (a qualified name ending in it), with their place under `[backward]`."""
    out = []
    todo = [(profile.root, False)]
    while todo:
        node, bwd = todo.pop()
        if node.function == function or node.function.endswith("." + function):
            if under_backward is None or under_backward == bwd:
                out.append(node)
        todo.extend((c, bwd or node.function == "[backward]") for c in node.children)
    return out


def error_bars(profile: Any, function: str) -> float:
    """The GPU error bar of a function's launch paths (the kernel table's, summed)."""
    stacks = (profile.extra.get("gpu_kernels") or {}).get("stacks") or []
    return sum(s["error_j"] for s in stacks if any(f[0] == function or str(f[0]).endswith("." + function)
                                                   for f in s["path"]))


def check(label: str, value: float, ok: bool, target: str) -> None:
    print(f"  {label:58s} {value:12.4g}   target {target:24s} {'ok' if ok else 'NOT MET'}")


def phases(folder: str) -> None:
    print("phases (--gpu-kernels, whole run one cycle):")
    r = run(PHASES, [], ["--gpu-kernels"], folder, "phases")
    prof, counter = r["profile"], r["figures"]["counter_j"]
    for name, truth in counter.items():
        nodes = find(prof, name)
        got = sum(gpu_j(n) for n in nodes)
        err = (got - truth) / truth if truth else float("nan")
        bar = error_bars(prof, name)
        check(f"{name}: GPU J vs counter {truth:.1f} J (relative error)", err, abs(err) <= 0.03, "|err| <= 3%")
        check(f"{name}: error bar / its joules", bar / got if got else float("nan"),
              got > 0 and bar / got < 0.10 and abs(got - truth) <= bar, "< 10%, holds the error")
    split = [d.get("split_share") for d in (prof.extra.get("gpu_kernels") or {}).get("devices", {}).values()]
    print(f"  share of the GPU's energy split by kernels: {split}")


def chain(folder: str, steps: int) -> None:
    print(f"chain of 8 matmuls with backward ({steps} steps, --gpu-kernels, cycles of 10 steps):")
    r = run(CHAIN, [str(steps)], ["--gpu-kernels"], folder, "chain")
    prof = r["profile"]
    fwd = sum(gpu_j(n) for n in find(prof, "forward", under_backward=False))
    bwd_nodes = [n for n in find(prof, "backward", under_backward=False) if "torch" in n.file]
    bwd = sum(gpu_j(n) for n in bwd_nodes)
    under_bwd_fwd = sum(gpu_j(n) for n in find(prof, "forward", under_backward=True))
    check("backward() line's GPU J / forward line's", bwd / fwd if fwd else float("nan"),
          fwd > 0 and abs(bwd / fwd - 2.0) <= 0.2, "2.0 +- 10%")
    check("share of backward's GPU J beneath the forward line", under_bwd_fwd / bwd if bwd else float("nan"),
          bwd > 0 and under_bwd_fwd / bwd >= 0.95, ">= 95%")


def gpt2(folder: str, steps: int, long_steps: int) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("gpt2: skipped (transformers is not importable)")
        return
    print(f"GPT-2 small from its config, bf16, 16 x 1024, {steps} steps:")
    plain = run(GPT2, [str(steps)], None, folder, "gpt2_plain")
    default = run(GPT2, [str(steps)], [], folder, "gpt2_default")
    whole = run(GPT2, [str(steps)], ["--gpu-kernels"], folder, "gpt2_whole")
    p = plain["figures"]["steps_per_s"]
    for tag, r, limit in (("default schedule", default, 0.01), ("whole-run capture", whole, 0.02)):
        x = r["figures"]["steps_per_s"] / p - 1.0
        check(f"{tag}: steps/s vs plain {p:.3f}", x, x >= -limit, f">= -{100 * limit:g}%")
    check("whole-run capture: wall time - plain's (s)", whole["wall_s"] - plain["wall_s"],
          whole["wall_s"] <= plain["wall_s"] + 3.0, "<= 3 s")
    prof = whole["profile"]
    stacks = (prof.extra.get("gpu_kernels") or {}).get("stacks") or []
    total = sum(s["joules"] for s in stacks)
    top = sum(s["joules"] for s in stacks if s["path"] and str(s["path"][0][0]).startswith("["))
    user = sum(s["joules"] for s in stacks if any(os.path.basename(str(f[1])) == "gpt2_whole.py" for f in s["path"]))
    check("share of kernel J on the program's stacks", user / total if total else float("nan"),
          total > 0 and user / total >= 0.95, ">= 95%")
    check("kernel J at the top (no Python stack)", top, top == 0, "0")
    bwd_nodes = [n for n in find(prof, "backward", under_backward=False) if "torch" in n.file]
    bwd = sum(gpu_j(n) for n in bwd_nodes)
    step = find(prof, "train_step", under_backward=False)
    fwd = sum(gpu_j(c) for s in step for c in s.children if c.function.endswith("_call_impl")
              or c.function.endswith("forward"))
    check("backward / forward GPU J", bwd / fwd if fwd else float("nan"), fwd > 0 and 1.5 <= bwd / fwd <= 2.6,
          "1.5 to 2.6")
    split = [d.get("split_share") for d in (default["profile"].extra.get("gpu_kernels") or {}).get("devices", {}).values()]
    print(f"  default schedule: share of the GPU's energy split by kernels {split}")
    if long_steps:
        long = run(GPT2, [str(long_steps)], ["--gpu-kernels"], folder, "gpt2_long")
        lp = long["profile"]
        for tag, pr in ((f"{steps} steps", prof), (f"{long_steps} steps", lp)):
            fold = (pr.extra.get("gpu_kernels") or {}).get("fold") or {}
            print(f"  {tag}: kernel fold entries {fold.get('entries')}, cell {fold.get('cell_ns')} ns,"
                  f" paths {fold.get('paths')}, program peak RSS {pr.totals.peak_rss_bytes}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("phases", "chain", "gpt2"))
    ap.add_argument("--chain-steps", type=int, default=60)
    ap.add_argument("--gpt2-steps", type=int, default=200)
    ap.add_argument("--long-steps", type=int, default=2000, help="0: skip the long run")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        raise SystemExit("needs torch with CUDA") from None
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing run (this benchmark needs an NVIDIA GPU)")
        return
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="energyprof-gpu-step-") as folder:
        if a.only in (None, "phases"):
            phases(folder)
        if a.only in (None, "chain"):
            chain(folder, a.chain_steps)
        if a.only in (None, "gpt2"):
            gpt2(folder, a.gpt2_steps, a.long_steps)


if __name__ == "__main__":
    main()
