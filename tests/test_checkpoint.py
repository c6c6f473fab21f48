"""Starting a run from another checkpoint's weights: only an exact fit loads, with one clear message otherwise."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from seqmix.checkpoint import load_weights
from seqmix.errors import SeqmixError


class Vocabulary:
    def __init__(self, text: str) -> None:
        self.text = text

    def to_json(self) -> str:
        return self.text


class TinyTask(nn.Module):
    def __init__(self, vocabulary: str, width: int = 4) -> None:
        super().__init__()
        self.tokenizer = Vocabulary(vocabulary)
        self.proj = nn.Linear(width, 3)


def save(tmp_path, task: TinyTask) -> str:
    path = tmp_path / "source.ckpt"
    torch.save({"state_dict": task.state_dict(), "seqmix": {"tokenizer": task.tokenizer.to_json()}}, path)
    return str(path)


def test_weights_load_when_vocabulary_names_and_shapes_match(tmp_path):
    source, target = TinyTask('{"v": 1}'), TinyTask('{"v": 1}')
    load_weights(target, save(tmp_path, source))
    torch.testing.assert_close(target.proj.weight, source.proj.weight, rtol=0, atol=0)


@pytest.mark.parametrize("target,needle", [(TinyTask('{"v": 2}'), "vocabulary differs"),
                                           (TinyTask('{"v": 1}', width=5), "shape (3, 4) vs (3, 5)")])
def test_a_different_vocabulary_or_shape_is_refused(tmp_path, target, needle):
    before = target.proj.weight.clone()
    with pytest.raises(SeqmixError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_weights(target, save(tmp_path, TinyTask('{"v": 1}')))
    assert torch.equal(target.proj.weight, before)
