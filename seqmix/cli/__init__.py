"""The commands: train, generate and preprocess behind the Hydra entry points at the repository root, and the guarded runner they share."""
