"""Optional integrations (torch, ...): each imports its framework lazily, so that importing
energyprof never costs a framework's start-up time, and a missing framework only matters to
the user who asked for its integration."""
