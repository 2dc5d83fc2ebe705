"""Power read through a system-on-chip's own tool: Jetson (tegrastats, jtop), Apple silicon (powermetrics, macmon)."""

from ..presence import on_jetson  # noqa: F401 - a Jetson, told before any tool's module is imported
