"""``generate.py quantize=int8`` (seqmix/models/quantized.py): a copy of the model whose Linear layers run in dynamic
int8 gives log-probabilities close to float32 and decodes the same way through the task; the original is untouched;
another value or a GPU device is refused in one line."""

from __future__ import annotations

import pytest
import torch

from seqmix.config.build import build_task
from seqmix.data.tokenizer import train_tokenizer
from seqmix.errors import SeqmixError
from seqmix.interop.fairseq import save_seqmix_checkpoint
from seqmix.models.quantized import check_quantize, quantize_int8, quantized_linears
from tests.helpers import describe, run, run_config

TINY = ["model=transformer_small", "model.embed_dim=32", "model.encoder.layers=2", "model.decoder.layers=2",
        "model.encoder.ffn_dim=64", "model.decoder.ffn_dim=64", "model.encoder.heads=4", "model.decoder.heads=4",
        "model.decoder.cross_attention_heads=4"]
TEXTS = ["a b c d", "h g f", "c c a b e"]


def tiny_task():
    torch.manual_seed(0)
    task = build_task(run_config(TINY), train_tokenizer(["a b c d e f g h", "h g f e d c b a"] * 20, vocab_size=40))
    return task.eval()


def test_int8_log_probs_stay_close_to_float32_and_it_decodes():
    task = tiny_task()
    q = quantize_int8(task.model)
    assert quantized_linears(task.model) == 0 and quantized_linears(q) == 2 * 4 * 2 + 2 * 4 + 2 * 2 * 2
    torch.manual_seed(1)
    vocab = task.tokenizer.vocab_size
    src = torch.randint(4, vocab, (6, 9))
    src[:, -1] = 2
    prev = torch.randint(4, vocab, (6, 7))
    prev[:, 0] = 2
    with torch.no_grad():
        a = torch.log_softmax(task.model(src, prev), -1)
        b = torch.log_softmax(q(src, prev), -1)
    diff = (a - b).abs()
    # measured here (d=32, fbgemm): mean 0.017, max 0.084, argmax the same at 98% of positions; margins for other
    # CPUs' int8 kernels
    assert diff.mean() < 0.05 and diff.max() < 0.3, (diff.mean(), diff.max())
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.85
    before = task.evaluate_texts(TEXTS, None)[0]
    task.model = q
    after = task.evaluate_texts(TEXTS, None)[0]
    assert len(after) == len(TEXTS) and all(isinstance(h, str) for h in after)
    assert sum(x == y for x, y in zip(before, after)) >= 2, (before, after)


def test_only_int8_on_cpu_is_accepted():
    assert check_quantize(None, "cuda") is None
    assert check_quantize("int8", torch.device("cpu")) == "int8"
    with pytest.raises(SeqmixError, match="CPU only"):
        check_quantize("int8", "cuda")
    with pytest.raises(SeqmixError, match="int8"):
        check_quantize("int4", "cpu")


@pytest.mark.slow
def test_generate_py_decodes_quantized_and_validates_the_key(tmp_path):
    save_seqmix_checkpoint(tmp_path / "m.ckpt", tiny_task())
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in TEXTS))
    common = [f"ckpt_path={tmp_path / 'm.ckpt'}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'out.txt'}",
              "device=cpu"]
    proc = run("generate.py", [*common, "quantize=int8"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert "quantize=int8: 32 Linear layers in int8" in proc.stdout
    assert f"({sum(p.numel() for p in tiny_task().model.parameters()):,} parameters)" in proc.stdout  # all counted
    assert len((tmp_path / "out.txt").read_text().splitlines()) == len(TEXTS)
    proc = run("generate.py", [*common, "quantize=int4"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("seqmix: error: quantize="), \
        describe(proc)
