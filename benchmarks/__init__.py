"""Benchmarks: `python -m benchmarks [NAME ...]` from the repo root (see __main__.py)."""
