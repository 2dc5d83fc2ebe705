"""Power read through a system-on-chip's own tool: Jetson (tegrastats, jtop), Apple silicon (powermetrics, macmon)."""
