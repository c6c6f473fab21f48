"""Triton kernels (one folder per op: kernels.py, ops.py, reference.py). Never imports seqmix."""
