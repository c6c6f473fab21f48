"""seqmix: sequence models with a swappable token mixer."""
