"""A stand-in for ROCm's `amdsmi` binding: the functions energyprof calls, over GPUs whose power
is known, so that a counter's joules are that power times real time. GPUs come from
FAKE_AMDSMI_GPUS (JSON), so that the same module serves in-process tests and, copied as
`amdsmi.py` onto PYTHONPATH, the real CLI. Each GPU: bdf, name, watts, counter (ok, none,
frozen, backward, under, old-key), power (current, average)."""

import json
import os
import time

T0 = time.perf_counter()
GPUS = json.loads(os.environ.get("FAKE_AMDSMI_GPUS", "[]"))
RESOLUTION = 15.300000190734863


class AmdSmiLibraryException(Exception):
    pass


def amdsmi_init(flag=None):
    if os.environ.get("FAKE_AMDSMI_INIT_FAILS"):
        raise AmdSmiLibraryException("AMDSMI_STATUS_DRIVER_NOT_LOADED")


def amdsmi_shut_down():
    pass


def amdsmi_get_processor_handles():
    return [f"handle-{i}" for i in range(len(GPUS))]


def _gpu(h):
    return GPUS[int(h.split("-")[1])]


def amdsmi_get_gpu_device_bdf(h):
    return _gpu(h)["bdf"]


def amdsmi_get_gpu_asic_info(h):
    return {"market_name": _gpu(h)["name"], "vendor_id": "0x1002", "device_id": "0x740f"}


def amdsmi_get_energy_count(h):
    g = _gpu(h)
    mode = g.get("counter", "ok")
    if mode == "none":
        raise AmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")
    uj = (time.perf_counter() - T0) * g["watts"] * 1e6
    if mode == "frozen":
        uj = 8152136 * RESOLUTION
    elif mode == "backward":
        uj = 1e13 - uj
    elif mode == "under":
        uj /= 15
    key = "power" if mode == "old-key" else "energy_accumulator"
    return {key: int(uj / RESOLUTION), "counter_resolution": RESOLUTION, "timestamp": time.time_ns()}


def amdsmi_get_power_info(h):
    g = _gpu(h)
    which = g.get("power", "current")
    return {"current_socket_power": g["watts"] if which == "current" else "N/A",
            "average_socket_power": g["watts"] if which == "average" else "N/A",
            "gfx_voltage": 768, "soc_voltage": 925, "mem_voltage": 1250, "power_limit": 300}


def amdsmi_get_gpu_process_list(h):
    """The processes on the GPU: `pids` in the GPU's entry (none listed when absent)."""
    return [{"name": "python3", "pid": pid, "mem": 0, "engine_usage": {"gfx": 0}} for pid in _gpu(h).get("pids", [])]
