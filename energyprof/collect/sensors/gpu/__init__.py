"""GPU sensors: CUDA numbering, a thin NVML device wrapper, the NVML sensor and the process share (room for amdsmi)."""
