"""What a run shows beyond scalars, for wandb and for users without it: the composed config and the parameter count
given to every logger (wandb's config, the CSV logger's hparams.yaml), a table of sample outputs beside their
references after each validation (wandb), and pictures of what each layer's mixer does over one validation
sentence (``seqmix.training.mixer_pictures``), saved as PNG files in the run folder and logged as wandb images."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger

from seqmix.mixers.base import TokenMixer
from seqmix.models.encoder_decoder import count_parameters
from seqmix.training.mixer_pictures import draw_mixing, readable

_SIDE_OF_TOKENS = {"encoder": "source", "decoder": "target"}
_SAMPLE_CHARS = 400  # a long source (a summarization document) is cut in the table


def _wandb_loggers(trainer: L.Trainer) -> list[WandbLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]


def _mixers_by_side(module: torch.nn.Module) -> dict[str, list[tuple[str, TokenMixer]]]:
    """The token mixers of each stack ("encoder", "decoder"), in layer order, named as modules are named."""
    sides: dict[str, list[tuple[str, TokenMixer]]] = {}
    for name, sub in module.named_modules():
        if isinstance(sub, TokenMixer) and ".layers." in name:
            side = name.split(".layers.")[0].rsplit(".", 1)[-1]
            sides.setdefault(side, []).append((name, sub))
    return sides


class Dashboard(Callback):
    """``samples``: rows of the samples table (0: none); ``pictures``: draw the mixers after each validation into
    ``pictures_dir`` (``<run>/pictures/<side>-step<N>.png``), showing the first ``max_heads`` heads of each layer
    over the first sentence of the first validation batch (the same sentence every time)."""

    def __init__(self, samples: int = 8, pictures: bool = True, pictures_dir: str | None = None,
                 max_heads: int = 4) -> None:
        self.samples = samples
        self.pictures = pictures and pictures_dir is not None
        self.pictures_dir = Path(pictures_dir) if pictures_dir else None
        self.max_heads = max_heads
        self._hooks: list = []
        self._captured: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._tokens: dict[str, torch.Tensor] = {}
        self._logged_report = None

    # --- config and size ---------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.pictures and trainer.is_global_zero:
            self.pictures_dir.mkdir(parents=True, exist_ok=True)  # a folder that cannot be made fails before training
        params = {**getattr(pl_module, "run_config", {}), "parameters": count_parameters(pl_module.model)}
        for logger in trainer.loggers:
            logger.log_hyperparams(params)
        for logger in _wandb_loggers(trainer) if trainer.is_global_zero else []:  # other ranks: a dummy run
            logger.experiment.summary["parameters"] = params["parameters"]

    # --- capture one sentence's mixing weights during the first validation batch ------------------------------
    def _wanted(self, trainer: L.Trainer) -> bool:
        return self.pictures and trainer.is_global_zero and not trainer.sanity_checking

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx != 0 or not self._wanted(trainer):
            return
        self._captured, self._tokens = {}, pl_module.dashboard_tokens(batch)
        for mixers in _mixers_by_side(pl_module).values():
            for name, mixer in mixers:
                self._hooks.append(mixer.register_forward_pre_hook(partial(self._capture, name), with_kwargs=True))

    def _capture(self, name: str, mixer: TokenMixer, args: tuple, kwargs: dict) -> None:
        """The mixer's first full-sequence call of the batch (decoding's incremental calls carry a state)."""
        if name in self._captured or kwargs.get("state", args[2] if len(args) > 2 else None) is not None:
            return
        x = args[0] if args else kwargs["x"]
        mask = kwargs.get("key_padding_mask", args[1] if len(args) > 1 else None)
        with torch.no_grad():
            weights = mixer.mixing_weights(x[:1], None if mask is None else mask[:1])
        if weights is not None:
            keep = None if mask is None else ~mask[0]
            self._captured[name] = (weights[0], keep)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # --- after validation: the samples table and the pictures ------------------------------------------------
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        step = trainer.global_step
        self._log_samples(trainer, getattr(pl_module, "reports", {}).get("valid"), step)
        if self._captured:
            self._draw(trainer, pl_module, step)
        self._captured = {}

    def _log_samples(self, trainer: L.Trainer, report, step: int) -> None:
        if not self.samples or report is None or report is self._logged_report or not report.examples:
            return
        self._logged_report = report
        rows = [[src[:_SAMPLE_CHARS], out, ref] for src, out, ref in report.examples[: self.samples]]
        for logger in _wandb_loggers(trainer):
            logger.log_text(key="val/samples", columns=["source", "output", "reference"], data=rows, step=step)

    def _labels(self, tokenizer, side: str, keep: torch.Tensor) -> list[str] | None:
        ids = self._tokens.get(side)
        if ids is None or ids.numel() != keep.numel() or not hasattr(tokenizer, "piece"):
            return None
        return [readable(tokenizer.piece(i, _SIDE_OF_TOKENS.get(side, "target"))) for i in ids[keep.cpu()].tolist()]

    def _kept_steps(self, side: str, keep: torch.Tensor | None, length: int, pad: int) -> torch.Tensor:
        """The row's real steps: the padding mask's, else (a decoder: no mask) its tokens that are not pads."""
        if keep is not None:
            return keep.cpu()
        ids = self._tokens.get(side)
        if ids is not None and ids.numel() == length:
            return (ids != pad).cpu()
        return torch.ones(length, dtype=torch.bool)

    def _draw(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        for side, mixers in _mixers_by_side(pl_module).items():
            captured = [(layer, mixer, *self._captured[name]) for layer, (name, mixer) in enumerate(mixers)
                        if name in self._captured]
            if not captured:
                continue
            _, _, first, mask_keep = captured[0]  # one sentence: every layer of a side has the same steps
            keep = self._kept_steps(side, mask_keep, first.size(-1), pl_module.tokenizer.pad)
            layers = [(f"layer {layer + 1} {type(mixer).__name__}", weights.cpu()[:, keep][:, :, keep])
                      for layer, mixer, weights, _ in captured]
            path = self.pictures_dir / f"{side}-step{step:06d}.png"
            draw_mixing(layers, self._labels(pl_module.tokenizer, side, keep),
                        f"{side} mixing weights after {step} updates (rows: outputs, columns: inputs)", path,
                        self.max_heads)
            for logger in _wandb_loggers(trainer):
                logger.log_image(key=f"mixers/{side}", images=[str(path)], step=step, caption=[f"step {step}"])
