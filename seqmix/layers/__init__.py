"""Building blocks shared by mixers and models: attention, per-head convolutions and their banded PyTorch path,
embeddings and positions, dropout, padding masks."""
