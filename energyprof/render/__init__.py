"""Renderers: each reads a Profile and nothing else."""
