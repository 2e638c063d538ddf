"""experiments/pretrain.py end to end on tiny settings, and the shipped base."""

import dataclasses
import os

import numpy as np
import pytest
import safetensors.numpy

from experiments import pretrain
from rlreason import config
from rlreason.model import hf
from rlreason.model import presets
from rlreason.model import tokenizer as tokenizer_lib

TINY = dict(
  model="tiny",
  steps=3,
  batch_size=4,
  documents=64,
  card_problems=2,
  card_samples=2,
  mesh_fsdp=1,
)


@pytest.fixture
def one_level(monkeypatch):
  monkeypatch.setattr(pretrain, "card_levels", lambda: {"arithmetic": 1})


def test_pretrain_writes_a_loadable_reproducible_base_with_its_card(
  tmp_path, one_level
):
  outs = []
  for run in ("a", "b"):
    cfg = dataclasses.replace(
      pretrain.Config(), **TINY, bpe_vocab=300, workdir=str(tmp_path / run)
    )
    cfg.validate()
    outs.append(pretrain.run(cfg)["out"])
  a, b = (
    safetensors.numpy.load_file(os.path.join(o, "model.safetensors"))
    for o in outs
  )
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  a, b = (open(os.path.join(o, "tokenizer.json")).read() for o in outs)
  assert a == b  # the BPE vocabulary is learned deterministically too
  model_cfg, params = hf.load(outs[0])
  assert model_cfg.d_model == presets.get("tiny").d_model
  tok = tokenizer_lib.load(outs[0])
  assert not tok.char_level and tok.vocab_size == model_cfg.vocab_size
  assert tok.decode(tok.encode("3+4*12=")) == "3+4*12="
  card = open(os.path.join(outs[0], "README.md")).read()
  assert "| arithmetic | 1 | 2 |" in card and "pass@2" in card
  # The card alone, re-measured from the directory.
  cfg = dataclasses.replace(
    pretrain.Config(), **TINY, bpe_vocab=300, out=outs[0], card_only=True
  )
  cfg.validate()
  pretrain.run(cfg)


def test_pretrain_rejects_bad_flags(tmp_path):
  for bad in (
    dict(steps=0),
    dict(model="no-such-preset"),
    dict(bpe_vocab=100),
    dict(card_only=True, out=str(tmp_path)),
  ):
    with pytest.raises(config.ConfigError):
      dataclasses.replace(pretrain.Config(), **bad).validate()


def test_pretrain_with_the_character_tokenizer(tmp_path, one_level):
  cfg = dataclasses.replace(pretrain.Config(), **TINY, workdir=str(tmp_path))
  out = pretrain.run(cfg)["out"]
  tok = tokenizer_lib.load(out)
  assert tok.char_level and tok.encode(
    "3+4="
  ) == tokenizer_lib.CharTokenizer().encode("3+4=")
