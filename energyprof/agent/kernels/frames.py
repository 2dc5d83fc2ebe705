"""How the profiler's frames and the capture's special nodes are named: a tree frame is (function, file,
first line). Stdlib only: the program's half of the capture (agent/kernels/) and the supervisor's
readers (collect/kernels/kineto.py, core/kernels.py) share these names."""

from __future__ import annotations

OPERATOR_NODE = "[GPU kernels by operator]"  # no Python stack in the trace: kernels under their operator chain
UNLAUNCHED_NODE = "[launch not in trace]"  # a device record whose runtime call the trace does not hold
Frame = tuple[str, str, int]  # (function, file, first line), as core/recording.py
Path = tuple[Frame, ...]  # a tree path, outermost frame first

# python_function events that are not Python frames: C calls (named with an object's address, so
# one node per tensor) and module-hierarchy marks; the operator chain below them says the same.
MODULE_MARK = "nn.Module: "  # how torch names a module call's Python event (its mark)
NOT_FRAMES = ("<built-in ", MODULE_MARK)


def parse_python_name(name: str) -> Frame:
    """`file.py(12): forward` -> ("forward", "file.py", 12); other shapes keep the name whole.

    The profiler names a frame by its code's name (not its qualified name), its first line, and
    its file less the sys.path entry that holds it (`torch/nn/modules/module.py`)."""
    head, sep, func = name.partition("): ")
    if sep:
        file, paren, line = head.rpartition("(")
        if paren and line.isdigit():
            return (func, file, int(line))
    return (name, "", 0)
