"""``init_encoder_from=<teacher ckpt>``: a new model's encoder (and the embedding table it shares) starts from another
model's checkpoint on the same task and vocabulary, the rest from its own initialisation; encoders that compute
differently, other vocabularies and encoders without a place for every weight are refused in one line."""

from __future__ import annotations

import re

import pytest
import torch

from seqmix.config.build import build_task, load_task
from seqmix.data.tokenizer import train_word_tokenizer
from seqmix.errors import SeqmixError
from seqmix.training.checkpoints import load_encoder
from tests.helpers import TINY_TRANSFORMER, random_checkpoint, run, run_config

SIZE = ["model.embed_dim=16", "model.encoder.layers=1", "model.decoder.layers=1", "model.encoder.ffn_dim=32",
        "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2",
        "model.decoder.cross_attention_heads=2", "model.max_source_positions=32", "model.max_target_positions=32"]
# what makes a DisCo/CMLM encoder compute as transformer_small's does
AS_TEACHER = ["model.positions=sinusoidal", "model.scale_embedding=true", "model.encoder.activation=relu"]


def tokenizer(extra: list[str] = ()):
    return train_word_tokenizer(["a b c d e f g h", "h g f e d c b a", *extra] * 20, 40)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("teacher") / "t.ckpt", TINY_TRANSFORMER, tokenizer(), seed=0)


def student(model: str, *overrides: str, vocabulary=None):
    torch.manual_seed(1)
    return build_task(run_config([f"model={model}", *SIZE, *overrides]), vocabulary or tokenizer())


@pytest.mark.parametrize("model", ["disco", "cmlm"])
def test_the_student_encoder_is_the_teachers_and_the_rest_its_own(teacher, model):
    task = student(model, *AS_TEACHER)
    before = {k: v.clone() for k, v in task.state_dict().items()}
    fresh = load_encoder(task, teacher)
    taught = load_task(teacher)[0].state_dict()
    after = task.state_dict()
    encoder = [k for k in taught if k.startswith("model.encoder.")]
    assert encoder and fresh == []
    for k in encoder:
        rows = taught[k].size(0)
        assert torch.equal(after[k][:rows], taught[k]), k
        assert torch.equal(after[k][rows:], before[k][rows:]), k  # CMLM's mask row keeps its own
    shared = after["model.encoder.embed_tokens.weight"]
    assert task.model.embed_tokens.weight.data_ptr() == shared.data_ptr()  # one table: output and decoder too
    rest = [k for k in after if not k.startswith("model.encoder.") and after[k].data_ptr() != shared.data_ptr()]
    assert "model.length_token" in rest and any(k.startswith("model.decoder.layers.") for k in rest)
    assert all(torch.equal(after[k], before[k]) for k in rest)


def test_the_students_encoder_computes_as_the_teachers(teacher):
    """Source tokens through both encoders: equal outputs (the student's length token is its own extra position, so
    compare the student's encoder stack run on the tokens alone)."""
    task = student("disco", *AS_TEACHER)
    load_encoder(task, teacher)
    teacher_model = load_task(teacher)[0].model.eval()
    src = torch.tensor([[4, 5, 6, 7, 2], [8, 9, 2, 1, 1]])
    enc = task.model.encoder.eval()
    mask = src.eq(1)
    x = enc.embed(src).masked_fill(mask.unsqueeze(-1), 0.0)
    for layer in enc.layers:
        x = layer(x, key_padding_mask=mask)
    ours = enc.finish(x)
    theirs = teacher_model.encoder(src)  # (B, T, C)
    real = ~mask
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-5, atol=1e-5)


def test_an_encoder_that_computes_differently_is_refused_with_the_overrides_to_pass(teacher):
    with pytest.raises(SeqmixError, match="model.positions=sinusoidal model.scale_embedding=True "
                                          "model.encoder.activation=relu"):
        load_encoder(student("disco"), teacher)
    with pytest.raises(SeqmixError, match="model.encoder.layers=1"):
        load_encoder(student("disco", *AS_TEACHER, "model.encoder.layers=2"), teacher)


def test_another_vocabulary_is_refused(teacher):
    with pytest.raises(SeqmixError, match=f"vocabulary differs.*pass task.data.tokenizer.file={re.escape(str(teacher))} "):
        load_encoder(student("disco", *AS_TEACHER, vocabulary=tokenizer(["x y z"])), teacher)


def test_train_py_starts_a_student_with_the_teachers_vocabulary_and_encoder(teacher, tmp_path):
    """The command a user runs: the student's data take the teacher's vocabulary (task.data.tokenizer.file), so its
    encoder can start from the teacher's; after one update at the warmup's first lr (0) the encoder is still the teacher's (to Adam's weight
    decay at that lr)."""
    args = ["model=disco", *SIZE, *AS_TEACHER, f"task.data.tokenizer.file={teacher}", f"init_encoder_from={teacher}",
            "scheduler.warmup_init_lr=0", "trainer.max_steps=1", "trainer.max_epochs=-1", "run_test=false", "logger=csv",
            "task.data.source.num_train=100", "task.data.source.num_valid=10", "task.data.source.num_test=10",
            f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run("train.py", args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    trained = load_task(str(tmp_path / "run" / "checkpoints" / "last.ckpt"))[0].state_dict()
    taught = load_task(teacher)[0].state_dict()
    encoder = [k for k in taught if k.startswith("model.encoder.")]
    assert encoder
    for k in encoder:
        torch.testing.assert_close(trained[k], taught[k], rtol=0, atol=1e-6)
