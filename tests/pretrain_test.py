"""experiments/pretrain.py end to end on tiny settings, and the shipped base."""

import dataclasses
import os

import numpy as np
import pytest
import safetensors.numpy

from experiments import grpo
from experiments import pretrain
from rlreason import config
from rlreason.data import tasks
from rlreason.train import corpus
from rlreason.train import traces
from rlreason.eval import base_card
from rlreason.model import hf
from rlreason.model import presets
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.train import loaders

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
  monkeypatch.setattr(pretrain, "card_levels", lambda mix: {"arithmetic": 1})


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
    dict(drill=1.5),
    dict(hinted=-0.1),
    dict(check=2.0),
    dict(redo=1.5),
    dict(card_only=True, out=str(tmp_path)),
    dict(corpus_tasks="arithmetic5:1"),
    dict(corpus_tasks="no_such_task:1:1"),
    dict(corpus_tasks="arithmetic5:1:9"),
    dict(corpus_tasks="arithmetic5_order:1:2"),  # no solver writes it
  ):
    with pytest.raises(config.ConfigError):
      dataclasses.replace(pretrain.Config(), **bad).validate()
  with pytest.raises(config.ConfigError, match=r"^--corpus_tasks: 'x:1' is"):
    dataclasses.replace(pretrain.Config(), corpus_tasks="x:1").validate()
  # --drill / --redo reach the corpus mix; the default is the shipped base's
  # mix (addsub5 only, its hinted / check / redo shares) and "" is
  # corpus.Mix's tasks with the same shares.
  mix = dataclasses.replace(pretrain.Config(), drill=1.0, redo=0.5).mix()
  assert mix.drill == 1.0 and mix.redo == 0.5
  knobs = dict(hinted=0.3, check=0.2, redo=1.0)
  assert pretrain.Config().mix() == corpus.Mix(
    tasks=(("addsub5", 1.0, 3),), **knobs
  )
  assert dataclasses.replace(
    pretrain.Config(), corpus_tasks=""
  ).mix() == dataclasses.replace(corpus.Mix(), **knobs)
  # --corpus_tasks sets the mix's tasks, and the card measures those.
  cfg = dataclasses.replace(
    pretrain.Config(), corpus_tasks="arithmetic5:0.75:3,knights:0.25:2"
  )
  cfg.validate()
  assert cfg.mix().tasks == (("arithmetic5", 0.75, 3), ("knights", 0.25, 2))
  assert pretrain.card_levels(cfg.mix()) == {"arithmetic5": 3, "knights": 2}


def test_pretrain_with_the_character_tokenizer(tmp_path, one_level):
  cfg = dataclasses.replace(pretrain.Config(), **TINY, workdir=str(tmp_path))
  out = pretrain.run(cfg)["out"]
  tok = tokenizer_lib.load(out)
  assert tok.char_level and tok.encode(
    "3+4="
  ) == tokenizer_lib.CharTokenizer().encode("3+4=")


def test_the_shipped_base_is_a_small_hf_directory_that_solves_problems():
  path = presets.checkpoint_dir("laptop-base")
  names = set(os.listdir(path))
  for f in ("config.json", "model.safetensors", "tokenizer.json"):
    assert f in names, f"{path} lacks {f}"
  assert {"README.md", "base_card.json"} <= names  # the base card
  size = sum(os.path.getsize(os.path.join(path, f)) for f in names)
  assert size <= 16 * 2**20, f"{path}: {size / 2**20:.1f} MiB > 16 MiB"
  model_cfg, params = hf.load(path)  # the path real checkpoints take
  small = presets.get("small")
  assert (model_cfg.d_model, model_cfg.n_layers, model_cfg.vocab_size) == (
    small.d_model,
    small.n_layers,
    small.vocab_size,
  )
  tok = tokenizer_lib.load(path)
  assert tok.char_level
  # The main job loads it: `--model=laptop-base` is grpo.Config's default.
  assert grpo.Config().model == "laptop-base"
  assert loaders.load_tokenizer(grpo.Config()).char_level
  # Trained weights, not random ones: greedy decoding solves held-out
  # level-1 problems (the card measured 94.1%; random weights solve none).
  (row,) = base_card.measure(
    params,
    model_cfg,
    tok,
    {"addsub5": 1},
    problems=34,
    samples=2,
    max_new_tokens=128,
    progress=None,
  )
  assert row.greedy >= 0.5 and row.median_len >= 40, row


def test_the_shipped_base_knows_the_right_school_but_writes_the_wrong():
  """The main job's premise: on level-2 addsub5_order problems (where
  reading + before - changes the answer) the base's greedy trace names the
  wrong school, and with the right school's order line given it mostly
  solves them: a choice RL can move (base v2: 1.4% vs 97.1% on all 140)."""
  path = presets.checkpoint_dir("laptop-base")
  model_cfg, params = hf.load(path)
  tok = tokenizer_lib.load(path)
  task = tasks.get("addsub5_order")
  probs = task.problems("eval", 40, 2, 0)
  schools = traces.ADDSUB_SCHOOLS
  greedy = {}
  for name, prefix in (("plain", ""), ("right", schools.right_line + "\n")):
    prompts = base_card._prompts(tok, probs, False, prefix)  # noqa: SLF001
    out = base_card._sample(  # noqa: SLF001
      params,
      model_cfg,
      tok,
      prompts,
      samples=1,
      temperature=0.0,
      max_new_tokens=128,
      seed=0,
    )
    texts = [prefix + t for t in out.texts]
    greedy[name] = base_card._right(task, texts, probs).mean()  # noqa: SLF001
    if name == "plain":
      wrong = [t.startswith(schools.wrong_line) for t in texts]
      assert np.mean(wrong) >= 0.8, texts[:3]
  assert greedy["plain"] <= 0.2 and greedy["right"] >= 0.5, greedy
