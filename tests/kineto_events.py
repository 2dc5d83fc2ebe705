"""Kineto-shaped in-memory events (what `prof.profiler.kineto_results.events()` gives in torch 2.13,
`torch._C._autograd._KinetoEvent`), for the GPU parts a CPU build cannot record.

Each field is a method, as on the real event. Thread ids are as the profiler gives them: CPU events
carry the OS thread in `device_resource_id()` and the profiler's own thread id (1, 2, ...) in
`start_thread_id()`; backward ops carry the forward thread's profiler id in `fwd_thread_id()`; a device
record carries its device in `device_index()`, its stream in `device_resource_id()`, and the runtime
call's correlation id in `correlation_id()`. Times are Unix ns.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

CPU = SimpleNamespace(name="CPU")
CUDA = SimpleNamespace(name="CUDA")
MS = 1_000_000


class Event:
    def __init__(self, **fields: Any) -> None:
        self._f = {"activity_type": "cpu_op", "device_type": CPU, "device_index": 0, "device_resource_id": 0,
                   "correlation_id": 0, "linked_correlation_id": 0, "sequence_nr": -1, "fwd_thread_id": 0,
                   "start_thread_id": 0, "python_id": -1, "python_parent_id": -1, "name": "", "start_ns": 0,
                   "end_ns": 0, "stack": [], "scope": 0, "flow_id": 0, "flow_type": 0, "flow_start": False}
        self._f.update(fields)
        self._f["is_python_function"] = self._f["activity_type"] == "python_function"

    def __getattr__(self, name: str) -> Any:
        f = self.__dict__["_f"]
        if name in f:
            return lambda: f[name]
        raise AttributeError(name)


class Step:
    """A builder for one cycle's events at `base` Unix ns: times are given in ms from it."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.events: list[Event] = []
        self._pid = 0
        self._corr = 1000

    def t(self, ms: float) -> int:
        return self.base + int(round(ms * MS))

    def py(self, name: str, a: float, b: float, parent: int = -1, os_tid: int = 100) -> int:
        self._pid += 1
        self.events.append(Event(activity_type="python_function", name=name, start_ns=self.t(a), end_ns=self.t(b),
                                 python_id=self._pid, python_parent_id=parent, device_resource_id=os_tid,
                                 start_thread_id=1 if os_tid == 100 else 2))
        return self._pid

    def op(self, name: str, a: float, b: float, os_tid: int = 100, tid: int = 1, seq: int = -1, fwd: int = 0,
           flow: tuple[int, bool] | None = None) -> None:
        """A CPU op; `flow`: (id, start?) of a Kineto fwdbwd flow (type 1) it ends."""
        more = {"flow_id": flow[0], "flow_type": 1, "flow_start": flow[1]} if flow else {}
        self.events.append(Event(activity_type="cpu_op", name=name, start_ns=self.t(a), end_ns=self.t(b),
                                 device_resource_id=os_tid, start_thread_id=tid, sequence_nr=seq, fwd_thread_id=fwd,
                                 correlation_id=len(self.events) + 1, **more))

    def launch(self, at: float, kernel: str, ka: float, kb: float, os_tid: int = 100, device: int = 0) -> None:
        """A runtime call at `at` on a thread, and its kernel on the device over [ka, kb]."""
        self._corr += 1
        self.events.append(Event(activity_type="cuda_runtime", name="cudaLaunchKernel", start_ns=self.t(at),
                                 end_ns=self.t(at + 0.01), device_resource_id=os_tid, start_thread_id=os_tid,
                                 correlation_id=self._corr))
        self.events.append(Event(activity_type="kernel", name=kernel, device_type=CUDA, device_index=device,
                                 device_resource_id=7, start_ns=self.t(ka), end_ns=self.t(kb), correlation_id=self._corr))


def training_step(base: int, module_line: int = 30, train_line: int = 12) -> list[Event]:
    """One training step over [0, 100] ms: forward on the main thread (OS 100, profiler id 1), backward on
    autograd's thread (OS 200, profiler id 2), the optimizer on the main thread.
    - forward: model.py `forward` launches `fwd_gemm` from aten::mm (sequence number 5), busy 10-20 ms;
    - backward: `loss.backward()` (torch/_tensor.py `backward` on the main thread, 22-60 ms); autograd's
      thread runs MmBackward0 (sequence 5, forward thread 1), whose two aten::mm launch `bwd_gemm_a`
      (30-40 ms) and `bwd_gemm_b` (40-50 ms); AccumulateGrad follows (no forward op);
    - optimizer: optim.py `step` launches `adam` from aten::_foreach_add_, busy 80-85 ms.
    `train` and `<module>` were running when the cycle began: the profiler names them by their current
    lines (`train_line`; train's first line is 10)."""
    s = Step(base)
    mod = s.py(f"train.py({module_line}): <module>", 0, 100)
    train = s.py(f"train.py({train_line}): train", 0, 100, mod)
    fwd = s.py("model.py(20): forward", 1, 21, train)
    s.py("<built-in method relu of Tensor object at 0x7f>", 1.5, 1.6, fwd)
    s.op("aten::mm", 2, 8, seq=5)
    s.launch(3, "fwd_gemm", 10, 20)
    bwd = s.py("torch/_tensor.py(566): backward", 22, 60, train)
    s.py("torch/autograd/graph.py(966): _engine_run_backward", 23, 59, bwd)
    s.op("autograd::engine::evaluate_function: MmBackward0", 25, 38, os_tid=200, tid=2, seq=5, fwd=1)
    s.op("MmBackward0", 25.1, 37.9, os_tid=200, tid=2, seq=5, fwd=1)
    s.op("aten::mm", 26, 30, os_tid=200, tid=2)
    s.launch(27, "bwd_gemm_a", 30, 40, os_tid=200)
    s.op("aten::mm", 31, 35, os_tid=200, tid=2)
    s.launch(32, "bwd_gemm_b", 40, 50, os_tid=200)
    s.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 39, 41, os_tid=200, tid=2)
    s.op("torch::autograd::AccumulateGrad", 39.1, 40.9, os_tid=200, tid=2)
    opt = s.py("optim.py(30): step", 70, 90, train)
    s.py("optim.py(60): _update", 71, 89, opt)
    s.op("aten::_foreach_add_", 72, 78)
    s.launch(75, "adam", 80, 85)
    return s.events
