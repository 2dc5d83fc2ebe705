"""GPU sensors: CUDA numbering, a thin NVML device wrapper, the NVML sensor and the process share (room for amdsmi)."""

from ..presence import AMDSMI_INSTALL  # noqa: F401 - the step that enables amdsmi, said without importing amdsmi.py
