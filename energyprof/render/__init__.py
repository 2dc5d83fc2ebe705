"""Renderers: each reads the report model (analysis.report.build) and returns text; outputs.py writes it."""
