"""Bytes on disk: the one atomic file writer, and the per-user cache of start-up work."""
