"""Evaluation and benchmarks: accepted length, speed, serving load."""
