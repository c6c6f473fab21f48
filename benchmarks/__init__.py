"""Mixer sweep, training throughput, decoding, NAT decoding, data pipeline: ``python -m benchmarks.run`` (README.md)."""
