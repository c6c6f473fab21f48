"""seqmix: sequence models with a swappable token mixer. ``seqmix.load(checkpoint)`` is the Python API
(``seqmix.api``)."""


def load(*args, **kwargs):
    """``seqmix.api.load``: a trained model from its checkpoint (imported on first use, so that ``import seqmix``
    stays light)."""
    from seqmix.api import load as _load

    return _load(*args, **kwargs)


def load_fairseq(*args, **kwargs):
    """``seqmix.api.load_fairseq``: a fairseq checkpoint and its dictionaries, imported in memory."""
    from seqmix.api import load_fairseq as _load_fairseq

    return _load_fairseq(*args, **kwargs)
