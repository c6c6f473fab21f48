"""Benchmark harness: mixer-level speed/memory (``benchmarks.mixers``) and decoding speed (``benchmarks.decoding``).

Run everything with ``python -m benchmarks.run`` (``make bench``); see ``benchmarks/README.md``.
"""
