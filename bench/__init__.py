"""Benchmarks and measurements of the wizard (scripts; bench.gpu is importable for its tests)."""
