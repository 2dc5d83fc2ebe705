"""GPU sensors: CUDA numbering, a thin NVML device wrapper, the NVML sensor and the process share (room for amdsmi)."""

#: The step that enables amdsmi; here so that discovery can say it without importing amdsmi.py.
AMDSMI_INSTALL = ("install ROCm's Python binding (pip install amdsmi, matching the installed ROCm) on a machine "
                  "with an AMD GPU")
