"""The facts of one run: the Profile, its records, a window's Measurement, and the vocabulary they are
written in (policy.py: the idle policies, the share/all pair, the one CPU-share rule). Saved before any view."""
