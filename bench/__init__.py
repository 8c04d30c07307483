"""Benchmarks (not tests): the interrupt cycle against the engine's floor, parked-conversation
scale, and history cost. ``python -m bench`` (``make bench``) writes ``bench/results/``."""
