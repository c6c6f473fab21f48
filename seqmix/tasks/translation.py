"""TranslationTask: label-smoothed training, validation loss + BLEU by beam search, test BLEU."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable

import lightning as L
import torch
import torch.distributed as dist
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.generation import BeamSearch
from seqmix.metrics import BleuResult, corpus_bleu
from seqmix.tasks.losses import label_smoothed_nll_loss


def _all_gather_objects(obj):
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


class TranslationTask(L.LightningModule):
    """Wraps an encoder-decoder model; owns loss, optimizer/scheduler, decoding and BLEU."""

    def __init__(self, model: nn.Module, tokenizer, optimizer: Callable, scheduler: Callable | None = None,
                 label_smoothing: float = 0.1, generation: dict | None = None, bleu: dict | None = None,
                 eval_bleu: bool = True, run_config: dict | None = None) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.label_smoothing = label_smoothing
        self.generation = dict(generation or {})
        self.bleu_options = dict(bleu or {})
        self.eval_bleu = eval_bleu
        self.run_config = run_config or {}
        self._eval_outputs: list = []
        self._last_step_time: float | None = None
        self.last_bleu: dict[str, BleuResult] = {}

    # --- training ------------------------------------------------------------------------------
    def compute_loss(self, batch: dict) -> tuple[Tensor, Tensor, int]:
        logits = self.model(batch["src_tokens"], batch["prev_output_tokens"])
        return label_smoothed_nll_loss(logits, batch["target"], self.label_smoothing, self.tokenizer.pad)

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss, nll, ntokens = self.compute_loss(batch)
        if not torch.isfinite(loss):
            raise SeqmixError(
                f"training loss became {loss.item()} at step {self.global_step}. Checkpoints written so far are "
                "kept in the run's checkpoints/ folder; resume from the last one with a lower optim.lr, a longer "
                "warmup, gradient clipping (trainer.gradient_clip_val) or trainer.precision=bf16-mixed/32-true."
            )
        denom = max(ntokens, 1)
        now = time.perf_counter()
        if self._last_step_time is not None:
            self.log("train/tokens_per_s", ntokens / max(now - self._last_step_time, 1e-9), on_step=True)
        self._last_step_time = now
        bsz = batch["src_tokens"].size(0)
        self.log("train/loss", loss.detach() / denom, on_step=True, on_epoch=True, prog_bar=True, batch_size=bsz)
        self.log("train/nll", nll.detach() / denom, on_step=True, on_epoch=False, batch_size=bsz)
        self.log("train/ppl", torch.exp(nll.detach() / denom), on_step=True, on_epoch=False, batch_size=bsz)
        return loss / denom

    def on_before_optimizer_step(self, optimizer) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            self.log("train/grad_norm", norm, on_step=True, on_epoch=False)

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(params=self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        kwargs = {}
        params = inspect.signature(self.scheduler_factory).parameters
        if "total_updates" in params and params["total_updates"].default is inspect.Parameter.empty:
            kwargs["total_updates"] = int(self.trainer.estimated_stepping_batches)
        scheduler = self.scheduler_factory(optimizer, **kwargs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --- evaluation ----------------------------------------------------------------------------
    def beam_search(self, **overrides) -> BeamSearch:
        opts = {**self.generation, **overrides}
        tok = self.tokenizer
        return BeamSearch(bos=tok.bos, eos=tok.eos, pad=tok.pad, unk=tok.unk,
                          max_target_positions=getattr(self.model, "max_target_positions", None), **opts)

    def translate(self, src_tokens: Tensor, **overrides) -> list[str]:
        """Best hypothesis of each source row, detokenized."""
        hyps = self.beam_search(**overrides).generate(self.model, src_tokens)
        return [self.tokenizer.decode(h[0].tokens.tolist()) if h else "" for h in hyps]

    def _eval_step(self, batch: dict) -> None:
        loss, nll, ntokens = self.compute_loss(batch)
        hyps = self.translate(batch["src_tokens"]) if self.eval_bleu else []
        self._eval_outputs.append((float(loss), float(nll), ntokens, batch["id"].tolist(), hyps))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_start(self) -> None:
        self._eval_outputs = []

    on_test_epoch_start = on_validation_epoch_start

    def _eval_epoch_end(self, split: str, prefix: str) -> None:
        gathered = _all_gather_objects(self._eval_outputs)
        self._eval_outputs = []
        # under DDP, ranks with fewer batches repeat earlier ones: count every batch once (by its ids)
        unique = {tuple(o[3]): o for part in gathered for o in part}
        outputs = list(unique.values())
        loss = sum(o[0] for o in outputs)
        nll = sum(o[1] for o in outputs)
        ntok = max(sum(o[2] for o in outputs), 1)
        self.log(f"{prefix}/loss", loss / ntok, sync_dist=False, rank_zero_only=False)
        self.log(f"{prefix}/nll", nll / ntok, sync_dist=False)
        self.log(f"{prefix}/ppl", math.exp(min(nll / ntok, 50.0)), sync_dist=False)
        if not self.eval_bleu or self.trainer.sanity_checking:
            return
        by_id = {i: h for o in outputs for i, h in zip(o[3], o[4])}
        source = getattr(self, "reference_source", None) or self.trainer.datamodule
        refs = source.references(split)
        hyps = [by_id.get(i, "") for i in range(len(refs))]
        result = corpus_bleu(hyps, refs, **self.bleu_options)
        self.last_bleu[split] = result
        self.log(f"{prefix}/bleu", result.score, sync_dist=False)

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("valid", "val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end(getattr(self, "test_split", "test"), "test")

    # --- checkpoints ---------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["seqmix"] = {"config": self.run_config, "tokenizer": self.tokenizer.to_json(), "format": 1}
