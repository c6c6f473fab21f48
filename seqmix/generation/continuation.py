"""A decoder-only language model as beam search and sampling see a model, so that both continue prompts: there is
no source (``encode`` keeps only the batch size) and the prompt is a forced ``context`` prefix
(``seqmix.generation.beam_search``), read through the same incremental decoder state as the continuation."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn


@dataclass
class NoSource:
    """The encoder output of a model without an encoder: how many decoder rows it serves."""

    rows: int

    def index_select(self, index: Tensor) -> NoSource:
        return NoSource(index.numel())


class PromptedLanguageModel(nn.Module):
    """``lm`` (``DecoderOnly``) with the encoder-decoder decoding interface; ``decode`` returns log-probabilities
    (the output head's, an adaptive softmax's too)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.max_target_positions = lm.max_positions

    def encode(self, src_tokens: Tensor) -> NoSource:
        return NoSource(src_tokens.size(0))

    def for_beams(self, encoder_out: NoSource, k: int) -> NoSource:
        return NoSource(encoder_out.rows * k)

    def init_decoder_state(self, encoder_out: NoSource):
        return self.lm.init_state()

    def decode(self, prev_output_tokens: Tensor, encoder_out: NoSource, state=None) -> Tensor:
        return self.lm.log_probs(self.lm(prev_output_tokens, state))
