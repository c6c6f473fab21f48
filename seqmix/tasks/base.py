"""What every task shares: optimizer/scheduler from partials, a finite-loss guard, throughput and gradient-norm
logs, corpus-level evaluation aggregated across ranks, and the checkpoint's config + tokenizer.

A task receives a built model and its settings (``seqmix.config.build``); it owns its corpus metric
(``corpus_report``) and how it evaluates raw text for ``generate.py`` (``evaluate_texts``), so the entry points
need no per-task branches.
"""

from __future__ import annotations

import inspect
import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.generation.decode import TextHypothesis
from seqmix.layers.host_reads import read_interval
from seqmix.models.compiled import compile_for_training, enabled

CHECKPOINT_FORMAT = 1  # the "format" of checkpoint_meta; checkpoints written before it existed have none


def make_scheduler(factory, optimizer, estimated_updates):
    """``factory(optimizer)``; a schedule with a horizon (``total_updates``) the config leaves unset (null) gets
    ``estimated_updates()``, the trainer's estimate of the run's optimizer steps."""
    total = inspect.signature(factory).parameters.get("total_updates")
    if total is not None and (total.default is inspect.Parameter.empty or total.default is None):
        return factory(optimizer, total_updates=estimated_updates())
    return factory(optimizer)


@dataclass
class Report:
    """A task's verdict on one split: the main score (returned for sweeps), a headline and detail lines."""

    score: float
    headline: str
    details: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # logged as <prefix>/<name> during training
    # (source, output, reference) of every example in dataset order, for the dashboard's samples table
    examples: list[tuple[str, str, str]] = field(default_factory=list)


def all_gather_objects(obj) -> list:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


class SeqmixTask(L.LightningModule, ABC):
    """Subclasses implement the abstract hooks (``build_model``, ``compute_loss``, ``corpus_report``,
    ``evaluate_texts``: a task missing one cannot be constructed) and may add per-example evaluation outputs
    (``eval_outputs``) that ``corpus_report`` turns into a metric."""

    #: updates between host reads of the non-finite-loss flag (see ``watch_finite``); None: 1 on CPU, 50 elsewhere
    finite_check_interval: int | None = None
    #: the run config's top-level ``compile`` (true | false | auto; set by ``seqmix.config.build.build_task``)
    compile_training: bool | str = False
    #: the run config's top-level ``compile_decoding`` (``seqmix.models.compiled``; set by ``build_task``)
    compile_decoding: bool | str = False
    #: what a non-finite loss or gradient does (top-level ``nonfinite``): "raise" (``watch_finite``) or "skip" the
    #: update (``optimizer_step``), stopping after ``nonfinite_skip_limit`` skipped updates in a row
    nonfinite: str = "raise"
    nonfinite_skip_limit: int = 10

    def __init__(self, model: nn.Module, tokenizer, optimizer: Callable, scheduler: Callable | None = None,
                 run_config: dict | None = None) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.run_config = run_config or {}
        self._eval_outputs: list = []
        self._last_step_time: float | None = None
        self.timed_tokens, self.timed_seconds = 0, 0.0  # training throughput over the whole run (the run record's)
        self._first_nonfinite: Tensor | None = None  # step of the first non-finite loss (-1: none), on the device
        self.skipped_updates = 0  # updates dropped by nonfinite=skip for a non-finite loss or gradient
        self.loss_scale_skips = 0  # 16-mixed: steps the loss scaler skipped while the loss was finite (overflow)
        self._skipped_in_a_row = 0
        self._loss_nonfinite: Tensor | None = None  # nonfinite=skip: any non-finite loss since the last step
        self._compiled: dict[str, Callable] = {}  # a plain dict: nothing compiled is registered as a submodule
        self.reports: dict[str, Report] = {}
        self.test_split = "test"
        self.reference_source = None  # what corpus_report reads references from (default: the trainer's data)

    # --- training ------------------------------------------------------------------------------
    @abstractmethod
    def compute_loss(self, batch: dict) -> tuple[Tensor, Tensor, int]:
        """Summed (training loss, NLL) over the batch's scored tokens, and their count."""

    def compiled(self, name: str, fn: Callable) -> Callable:
        """``fn`` as this update should run it: compiled (once per ``name``, ``seqmix.models.compiled``) while
        ``compile_training`` is on for this device, the model trains and autograd records; ``fn`` itself otherwise,
        so validation, beam search and generate.py run the eager model."""
        if not (self.training and torch.is_grad_enabled() and enabled(self.compile_training, self.device.type)):
            return fn
        if name not in self._compiled:
            self._compiled[name] = compile_for_training(fn)
        return self._compiled[name]

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss, nll, ntokens = self.compute_loss(batch)
        if self.nonfinite == "raise":
            self.watch_finite(loss)
        else:  # on the device: optimizer_step reads it only when the loss scaler skipped the step
            bad = ~torch.isfinite(loss.detach())
            self._loss_nonfinite = bad if self._loss_nonfinite is None else self._loss_nonfinite | bad
        denom = max(ntokens, 1)
        now = time.perf_counter()
        if self._last_step_time is not None:
            self.log("train/tokens_per_s", ntokens / max(now - self._last_step_time, 1e-9), on_step=True)
            self.timed_tokens += ntokens
            self.timed_seconds += now - self._last_step_time
        self._last_step_time = now
        bsz = batch["id"].numel()
        self.log("train/loss", loss.detach() / denom, on_step=True, on_epoch=True, batch_size=bsz)
        self.log("train/nll", nll.detach() / denom, on_step=True, on_epoch=False, batch_size=bsz)
        self.log("train/ppl", torch.exp(nll.detach() / denom), on_step=True, on_epoch=False, batch_size=bsz)
        return loss / denom

    def watch_finite(self, loss: Tensor) -> None:
        """Remember the first update whose loss is not finite, on the loss's device. Reading it back stalls a GPU,
        so it is read every update on CPU, every ``finite_check_interval`` (50) updates elsewhere, and always before a
        checkpoint is written (``on_save_checkpoint``), so no checkpoint ever holds what a NaN update produced."""
        step = torch.full((), self.global_step, device=loss.device)
        bad = ~torch.isfinite(loss.detach())
        first = self._first_nonfinite
        self._first_nonfinite = torch.where(bad, step, -1) if first is None else \
            torch.where(bad & first.lt(0), step, first)
        interval = read_interval(self.finite_check_interval, loss.device)
        if (self.global_step + 1) % interval == 0:
            self.raise_if_nonfinite()

    def on_train_end(self) -> None:
        self.raise_if_nonfinite()  # the updates since the last read-back (a short run on a GPU reads it never)

    def raise_if_nonfinite(self) -> None:
        if self._first_nonfinite is None:
            return
        step = int(self._first_nonfinite)
        if step >= 0:
            raise SeqmixError(
                f"training loss became non-finite at step {step}. Checkpoints written so far are kept in the run's "
                "checkpoints/ folder; resume from the last one with a lower optim.lr, a longer warmup, gradient "
                "clipping (trainer.gradient_clip_val) or trainer.precision=bf16-mixed/32-true."
            )

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """With ``nonfinite=skip``: an update whose gradients (after the DDP all-reduce, so every rank agrees) are
        not finite leaves weights and optimizer state untouched (its gradients are dropped before the step; the
        step counter and lr schedule still advance). Deciding reads one flag back per update: a host sync on GPUs.
        Under 16-mixed the loss scaler skips steps whose scaled gradients overflow: while the loss was finite that is
        the scaler finding its scale (often several steps in a row at the start), counted in ``loss_scale_skips`` and
        not toward ``nonfinite_skip_limit``; a skip with a non-finite loss counts as a skipped update."""
        if self.nonfinite != "skip":
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        scale = scaler.get_scale() if scaler is not None else None
        dropped = []

        def closure():
            result = optimizer_closure()
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if scaler is None and params and not bool(torch.isfinite(tensor_norms(p.grad for p in params)).all()):
                for p in params:
                    p.grad = None
                dropped.append(True)
            return result

        optimizer.step(closure=closure)
        loss_nonfinite, self._loss_nonfinite = self._loss_nonfinite, None
        scaler_skipped = scaler is not None and scaler.get_scale() < scale
        if scaler_skipped and not (loss_nonfinite is not None and bool(loss_nonfinite)):
            self.loss_scale_skips += 1
        elif dropped or scaler_skipped:
            self._count_skipped()
        else:
            self._skipped_in_a_row = 0

    def _count_skipped(self) -> None:
        self.skipped_updates += 1
        self._skipped_in_a_row += 1
        if self._skipped_in_a_row >= self.nonfinite_skip_limit:
            raise SeqmixError(
                f"{self._skipped_in_a_row} updates in a row (the last at step {self.global_step}) had a non-finite "
                f"loss or gradient and were skipped ({self.skipped_updates} in all). The weights are still finite: "
                "resume from interrupted.ckpt with a lower optim.lr, gradient clipping (trainer.gradient_clip_val) "
                "or trainer.precision=bf16-mixed/32-true."
            )

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.nonfinite == "skip":
            self.log("train/skipped_updates", float(self.skipped_updates), on_step=True, on_epoch=False)
            if self.loss_scale_skips:
                self.log("train/loss_scale_skips", float(self.loss_scale_skips), on_step=True, on_epoch=False)

    def on_before_optimizer_step(self, optimizer) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            norm = torch.linalg.vector_norm(tensor_norms(grads))
            self.log("train/grad_norm", norm, on_step=True, on_epoch=False)

    def configure_optimizers(self):
        try:
            optimizer = self.optimizer_factory(params=self.parameters())
        except ValueError as err:  # torch's optimizers check their settings: "Invalid learning rate: -1", ...
            raise SeqmixError(f"optim: {err}; fix that optim.* setting") from None
        if self.scheduler_factory is None:
            return optimizer
        scheduler = make_scheduler(self.scheduler_factory, optimizer,
                                   lambda: int(self.trainer.estimated_stepping_batches))
        if isinstance(scheduler, dict):  # metric-driven (reduce_on_plateau): step once per validation epoch
            config = {"frequency": self.trainer.check_val_every_n_epoch or 1, **scheduler}
        else:
            config = {"scheduler": scheduler, "interval": "step"}
        return {"optimizer": optimizer, "lr_scheduler": config}

    # --- evaluation ----------------------------------------------------------------------------
    def dashboard_tokens(self, batch: dict) -> dict[str, Tensor]:
        """The token ids each side of the model reads in ``batch``'s first row ({"encoder": ..., "decoder": ...}):
        the labels of the dashboard's mixer pictures (``seqmix.training.dashboard``); {} pictures steps by number."""
        return {}

    def eval_outputs(self, batch: dict) -> list:
        """Per-example outputs kept for ``corpus_report`` (e.g. decoded hypotheses), in batch order."""
        return []

    @abstractmethod
    def corpus_report(self, split: str, prefix: str, by_id: dict, nll: float, ntokens: int) -> Report | None:
        """The split's metric from every example's ``eval_outputs`` (``by_id``) and the summed NLL."""

    def _eval_step(self, batch: dict) -> None:
        loss, nll, ntokens = self.compute_loss(batch)
        self._eval_outputs.append((float(loss), float(nll), ntokens, batch["id"].tolist(), self.eval_outputs(batch)))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_start(self) -> None:
        self._eval_outputs = []
        self._last_step_time = None  # the next update's time must not include this validation

    on_test_epoch_start = on_validation_epoch_start

    def _eval_epoch_end(self, split: str, prefix: str) -> None:
        gathered = all_gather_objects(self._eval_outputs)
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
        if self.trainer.sanity_checking:
            return
        by_id = {i: out for o in outputs for i, out in zip(o[3], o[4])}
        report = self.corpus_report(split, prefix, by_id, nll, ntok)
        if report is not None:
            self.reports[split] = report

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("valid", "val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end(self.test_split, "test")

    def references_from(self):
        return self.reference_source or self.trainer.datamodule

    @abstractmethod
    def evaluate_texts(self, sources: list[str], references: list[list[str]] | None, max_tokens: int,
                       **settings) -> tuple[list[str] | None, Report | None]:
        """``generate.py``: (one output line per source, or None) and a report when it can be scored."""

    def decode_outputs(self, sources: list[str], references: list[list[str]] | None, max_tokens: int = 8000,
                       max_sentences: int | None = None, request=None, **settings) -> tuple[list | None, Report | None]:
        """``generate.py`` and the Python API: per source its hypotheses (``seqmix.generation.decode.TextHypothesis``,
        what ``request``, a ``DecodeRequest``, asks for) or None, and the report; tasks that decode override it.
        This default offers only ``evaluate_texts``'s outputs, without scores."""
        if request is not None and not request.plain:
            raise SeqmixError(f"{type(self).__name__} gives one output per input: drop nbest=, sampling=, prefix_size=")
        if max_sentences is not None:
            settings["max_sentences"] = max_sentences
        outputs, report = self.evaluate_texts(sources, references, max_tokens, **settings)
        if outputs is None:
            return None, report
        return [[TextHypothesis(text)] for text in outputs], report

    def decoding_settings(self, **settings) -> str:
        """One line of what ``evaluate_texts`` runs with under ``settings`` (the task's own, each given one
        replacing its value; ``generate.py`` prints it); an unknown setting is the user error ``evaluate_texts``
        raises."""
        return ""

    # --- checkpoints ---------------------------------------------------------------------------
    def checkpoint_meta(self) -> dict:
        """What ``seqmix.config.build.load_task`` rebuilds the task from: the run config and the tokenizer."""
        return {"config": self.run_config, "tokenizer": self.tokenizer.to_json(), "format": CHECKPOINT_FORMAT}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.raise_if_nonfinite()  # before Lightning writes the file
        if not weights_finite(self):
            raise SeqmixError(f"the weights are not finite at step {self.global_step} (a non-finite gradient with a "
                              "finite loss?); not writing a checkpoint. Resume from the run's last checkpoint with "
                              "a lower optim.lr, gradient clipping (trainer.gradient_clip_val) or nonfinite=skip.")
        checkpoint["seqmix"] = self.checkpoint_meta()
        checkpoint["rng_states"] = rng_states()
        checkpoint["skipped_updates"] = self.skipped_updates

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A resumed run draws the dropout masks the uninterrupted run would have drawn next."""
        if "rng_states" in checkpoint:
            set_rng_states(checkpoint["rng_states"])
        self.skipped_updates = checkpoint.get("skipped_updates", 0)


def tensor_norms(tensors) -> Tensor:
    """The L2 norm of each tensor (in fp32 at least), stacked: one device tensor, read back at most once."""
    return torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors])


def weights_finite(module: nn.Module) -> bool:
    """Whether every parameter of ``module`` is finite (one read back)."""
    return bool(torch.stack([torch.isfinite(p).all() for p in module.parameters()]).all())


def rng_states() -> dict:
    """The global random generators (torch, CUDA, numpy, Python) in types a ``weights_only`` load accepts (as
    Lightning resumes). Every rank is seeded alike, so rank 0's states (the ones a checkpoint keeps) are every
    rank's."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if states["cuda"] and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
