"""Adaptive input embeddings (Baevski & Auli 2019) and adaptive softmax (Grave et al. 2017), tied.

A word vocabulary sorted by frequency is cut into bands ``[0, c1), [c1, c2), ..., [cn, V)``. Band i has vectors
of size ``d / factor**i`` and a projection to the model width ``d``, so rare words cost few parameters.
The softmax mirrors it: a head over band 0 plus one "cluster" logit per tail band, and for each tail a softmax
over its words, so ``log p(w) = log p_head(cluster(w)) + log p_tail(w | cluster)``. With tied weights, tail i
reuses band i's embedding and projection (the projection transposed). No cutoffs = one band = a plain tied
embedding and a full softmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.layers.dropout import Dropout


@dataclass(frozen=True)
class AdaptiveOptions:
    """Adaptive input/softmax of a language model (``task.adaptive``; fields in sorted order for the error text)."""

    cutoffs: tuple[int, ...] = ()  # band boundaries in the frequency-sorted vocabulary
    factor: float = 4.0  # each band's width is the previous one's / factor
    input: bool = False
    project_all_bands: bool = False  # fairseq's layout: a projection for every band, band 0's (d x d) included
    softmax: bool = False
    softmax_dropout: float = 0.0
    tie_projections: bool = True  # tied weights: the softmax tails reuse the input projections (fairseq's
    # tie_adaptive_proj); false: each tail has its own


def band_edges(vocab_size: int, cutoffs: Sequence[int]) -> list[int]:
    """``[0, c1, ..., cn, V]``; cutoffs must increase strictly and stay inside the vocabulary."""
    cuts = [int(c) for c in cutoffs]
    if any(b <= a for a, b in zip([0, *cuts], cuts)) or (cuts and cuts[-1] >= vocab_size):
        raise SeqmixError(f"adaptive cutoffs {cuts} must increase strictly and stay below the vocabulary size "
                          f"{vocab_size}; fix task.adaptive.cutoffs (or use a larger vocabulary)")
    return [0, *cuts, vocab_size]


class Band(nn.Module):
    """Vectors of one frequency band and their projection to the model width (None when already that wide)."""

    def __init__(self, size: int, dim: int, model_dim: int, padding_idx: int | None, project: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(size, dim, padding_idx=padding_idx)
        nn.init.normal_(self.embed.weight, mean=0.0, std=dim**-0.5)
        if padding_idx is not None:
            with torch.no_grad():
                self.embed.weight[padding_idx].zero_()
        self.proj = None
        if dim != model_dim or project:
            self.proj = nn.Linear(dim, model_dim, bias=False)
            nn.init.xavier_uniform_(self.proj.weight)


def _band_dims(model_dim: int, factor: float, n: int) -> list[int]:
    return [max(1, int(model_dim // (factor**i))) for i in range(n)]


def _log_softmax(logits: Tensor) -> Tensor:
    """In fp32 at least, whatever the autocast dtype."""
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


class AdaptiveInput(nn.Module):
    """Token ids -> (…, d) vectors, band by band. Duck-types ``nn.Embedding`` (``embedding_dim``, ``padding_idx``)
    so the shared ``Stack`` can use it as its token embedding."""

    def __init__(self, vocab_size: int, padding_idx: int, embed_dim: int, cutoffs: Sequence[int] = (),
                 factor: float = 4.0, project_all_bands: bool = False) -> None:
        super().__init__()
        self.edges = band_edges(vocab_size, cutoffs)
        if padding_idx >= self.edges[1]:
            raise SeqmixError(f"the padding id {padding_idx} must fall in the first adaptive band [0, {self.edges[1]})")
        dims = _band_dims(embed_dim, factor, len(self.edges) - 1)
        project = project_all_bands and len(dims) > 1  # one band is a plain embedding, never projected
        self.bands = nn.ModuleList(
            Band(hi - lo, dim, embed_dim, padding_idx if i == 0 else None, project)
            for i, (lo, hi, dim) in enumerate(zip(self.edges, self.edges[1:], dims))
        )
        self.embedding_dim = embed_dim
        self.padding_idx = padding_idx
        self.num_embeddings = vocab_size

    @property
    def weight(self) -> Tensor:
        """The full table when there is one band (what a plain embedding exposes)."""
        if len(self.bands) != 1:
            raise AttributeError("an adaptive input with several bands has no single weight table")
        return self.bands[0].embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        """In the tables' dtype whichever bands the tokens fall in: under autocast a projected band comes out in
        bf16 and an unprojected one in fp32, and a batch's dtype must not depend on which words it holds."""
        dtype = self.bands[0].embed.weight.dtype
        if len(self.bands) == 1:
            band = self.bands[0]
            x = band.embed(tokens)
            return (x if band.proj is None else band.proj(x)).to(dtype)
        out = self.bands[0].embed.weight.new_zeros(*tokens.shape, self.embedding_dim)
        for lo, hi, band in zip(self.edges, self.edges[1:], self.bands):
            mask = (tokens >= lo) & (tokens < hi)
            if not mask.any():
                continue
            x = band.embed(tokens[mask] - lo)
            out[mask] = (x if band.proj is None else band.proj(x)).to(dtype)
        return out


def _own_projection(band: Band) -> nn.Linear:
    """A projection shaped as ``band``'s (model width x band width), initialized apart."""
    proj = nn.Linear(band.proj.in_features, band.proj.out_features, bias=False)
    nn.init.xavier_uniform_(proj.weight)
    return proj


class AdaptiveSoftmax(nn.Module):
    """Log-probabilities over the vocabulary from (…, d) features; ``bands`` ties weights to an ``AdaptiveInput``.

    The head scores band 0's words with band 0's vectors as they are (a band-0 projection, which fairseq's adaptive
    input has, serves the input only: fairseq's tied head skips it too). ``project_all_bands``: untied tails project
    even when as wide as the model (fairseq's). ``tie_projections=False`` with tied ``bands``: each tail has its own
    projection (``tail_proj``, laid out as the band's) and shares only the word vectors."""

    def __init__(self, embed_dim: int, vocab_size: int, cutoffs: Sequence[int] = (), factor: float = 4.0,
                 dropout: float = 0.0, bands: nn.ModuleList | None = None, project_all_bands: bool = False,
                 tie_projections: bool = True) -> None:
        super().__init__()
        self.edges = band_edges(vocab_size, cutoffs)
        n = len(self.edges) - 1
        self.tail_proj = None
        if bands is None:
            dims = _band_dims(embed_dim, factor, n)
            bands = nn.ModuleList(Band(hi - lo, dim, embed_dim, None, project_all_bands and i > 0)
                                  for i, (lo, hi, dim) in enumerate(zip(self.edges, self.edges[1:], dims)))
        elif len(bands) != n or any(b.embed.num_embeddings != hi - lo
                                    for b, lo, hi in zip(bands, self.edges, self.edges[1:])):
            raise SeqmixError("tied adaptive softmax needs the same cutoffs as the adaptive input; set "
                              "task.adaptive.input and task.adaptive.softmax alike (or untie the weights)")
        elif not tie_projections:
            self.tail_proj = nn.ModuleList(nn.Identity() if b.proj is None else _own_projection(b) for b in bands[1:])
        self.bands = bands
        self.cluster = nn.Linear(embed_dim, n - 1, bias=False) if n > 1 else None
        if self.cluster is not None:
            nn.init.normal_(self.cluster.weight, mean=0.0, std=embed_dim**-0.5)
        self.dropout = Dropout(dropout)
        self.vocab_size = vocab_size

    def _band_logits(self, i: int, x: Tensor) -> Tensor:
        band = self.bands[i]
        proj = None if i == 0 else band.proj if self.tail_proj is None else self.tail_proj[i - 1]
        if isinstance(proj, nn.Linear):  # features -> band width through the (transposed) projection
            x = self.dropout(F.linear(x, proj.weight.t()))
        return F.linear(x, band.embed.weight)

    def _head(self, x: Tensor) -> Tensor:
        """log p over band 0's words followed by the tail clusters, in fp32."""
        logits = self._band_logits(0, x)
        if self.cluster is not None:
            logits = torch.cat([logits, self.cluster(x)], dim=-1)
        return _log_softmax(logits)

    def log_probs(self, x: Tensor) -> Tensor:
        """Full (…, V) log-probabilities (evaluation, small vocabularies, tests)."""
        head = self._head(x)
        size0 = self.edges[1]
        parts = [head[..., :size0]]
        for i in range(1, len(self.bands)):
            tail = _log_softmax(self._band_logits(i, x))
            parts.append(head[..., size0 + i - 1: size0 + i] + tail)
        return torch.cat(parts, dim=-1)

    def nll(self, x: Tensor, target: Tensor, ignore_index: int) -> Tensor:
        """-log p(target) per position (0 at ``ignore_index``); tails are computed only where targets fall."""
        flat_x, flat_t = x.reshape(-1, x.size(-1)), target.reshape(-1)
        head = self._head(flat_x)
        size0 = self.edges[1]
        keep = flat_t.ne(ignore_index)
        out = torch.zeros(flat_t.shape, dtype=head.dtype, device=head.device)
        in_head = keep & (flat_t < size0)
        out[in_head] = -head[in_head].gather(1, flat_t[in_head].unsqueeze(1)).squeeze(1)
        for i in range(1, len(self.bands)):
            lo, hi = self.edges[i], self.edges[i + 1]
            rows = (keep & (flat_t >= lo) & (flat_t < hi)).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            tail = _log_softmax(self._band_logits(i, flat_x[rows]))
            word = tail.gather(1, (flat_t[rows] - lo).unsqueeze(1)).squeeze(1)
            out[rows] = -(head[rows, size0 + i - 1] + word)
        return out.view(target.shape)
