"""GPU figures per function from a profile's kernel facts (`Profile.gpu_kernels`, core/gpu_tree.py). Pure.

A function's GPU joules are those of every launch stack it is on (counted once per stack, so a
recursive function is not counted twice), with the kernels of those stacks merged by name.

Its error bar: the stacks a function is on are those beneath the tree nodes where it first
appears on a path (one node per caller), and each node's stacks are disjoint from another's. A
node's bar is that of its stacks taken together (`GpuStack.node_error_j`): the samples they share
only among themselves move nothing out of the node. The function's bar is the sum of its nodes'
(worst cases are not assumed to cancel). A profile written before node bars were kept gives each
node the sum of its stacks' bars, a wider bound.
"""

from __future__ import annotations

from ..facts.profile import Profile
from ..facts.records import GpuDevice, GpuKernels, GpuKernelSum
from ..record import field, record

TOP_KERNELS = 10

Frame = tuple[str, str, int]


@record
class GpuFunction:
    function: str
    file: str
    line: int
    joules: float = 0.0
    error_j: float = 0.0
    busy_s: float = 0.0
    kernels: dict[str, GpuKernelSum] = field(default_factory=dict)

    def top_kernels(self, n: int = TOP_KERNELS) -> list[GpuKernelSum]:
        return sorted(self.kernels.values(), key=lambda k: -k.joules)[:n]


def gpu_table(profile: Profile) -> GpuKernels | None:
    """The profile's kernel facts, or None when it has none (a run without GPU kernels)."""
    return profile.gpu_kernels


def gpu_functions(profile: Profile) -> list[GpuFunction]:
    """Every frame on a launch stack with its inclusive GPU figures, most joules first."""
    gpu = profile.gpu_kernels
    if gpu is None:
        return []
    rows: dict[Frame, GpuFunction] = {}
    nodes: dict[tuple[int, int, Frame], int] = {}  # (device, parent node, frame) -> node: the stacks' tree
    counted: dict[Frame, set[int]] = {}  # a function's nodes whose bar it holds
    for stack in gpu.stacks:
        seen: set[Frame] = set()
        parent = -1
        for depth, frame in enumerate(stack.path):
            node = nodes.setdefault((stack.device, parent, frame), len(nodes))
            parent = node
            if frame in seen:  # recursion: the outer node holds this stack already
                continue
            seen.add(frame)
            row = rows.get(frame)
            if row is None:
                row = rows[frame] = GpuFunction(*frame)
            row.joules += stack.joules
            row.busy_s += stack.busy_s
            if stack.node_error_j is None:
                row.error_j += stack.error_j
            elif node not in counted.setdefault(frame, set()):
                counted[frame].add(node)
                row.error_j += stack.node_error_j[depth]
            for k in stack.kernels:
                m = row.kernels.get(k.name)
                if m is None:
                    m = row.kernels[k.name] = GpuKernelSum(k.name)
                m.count += k.count
                m.time_s += k.time_s
                m.joules += k.joules
    return sorted(rows.values(), key=lambda r: -r.joules)


def gpu_devices(profile: Profile) -> list[tuple[str, GpuDevice]]:
    """Per device (its number, its figures): energy, idle, busy time, the share from records shorter
    than the sensor sees."""
    gpu = profile.gpu_kernels
    if gpu is None:
        return []
    return sorted(gpu.devices.items())
