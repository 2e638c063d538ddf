"""The loop's rollouts under --rollout_batching: continuous (the default)
and static give the same samples; with all rows in one call (the laptop
default, --rollout_rows=0 on a backend without memory stats) both run the
static sampler."""

import dataclasses
import re

import numpy as np
import pytest

from experiments import grpo
from rlreason import config
from rlreason import testing
from rlreason.data import sources as data_lib
from rlreason.model import attention
from rlreason.model import blocks
from rlreason.model import tokenizer
from rlreason.sampling import engine
from rlreason.sampling import rollout as rollout_lib
from rlreason.train import context as context_lib


EXAMPLES = "task:arithmetic:difficulty=1,n=4"  # 16 rows in groups of 4


def _context(**overrides):
  cfg = dataclasses.replace(
    grpo.TinyConfig(),
    max_new_tokens=12,
    warm_start_steps=0,
    mesh_fsdp=1,
    group_size=4,
    **overrides,
  )
  cfg.validate()
  return testing.tiny_context(cfg)


def _rollout(monkeypatch, **overrides):
  ctx = _context(**overrides)
  slots = []
  real = rollout_lib._sample_rows
  monkeypatch.setattr(
    rollout_lib,
    "_sample_rows",
    lambda *a, **k: slots.append(k.get("slots", 0)) or real(*a, **k),
  )
  examples = data_lib.load(EXAMPLES, "train")
  ro = testing.tiny_rollout(ctx, examples)
  return ro, slots


def test_continuous_is_the_default_and_samples_as_static(monkeypatch):
  assert grpo.TinyConfig().rollout_batching == "continuous"
  static, calls = _rollout(
    monkeypatch, rollout_rows=5, rollout_batching="static"
  )
  assert calls == [0, 0, 0, 0]  # 16 rows in calls of 5
  cont, calls = _rollout(monkeypatch, rollout_rows=5)
  assert calls == [5]  # one call, 5 decode slots
  one, calls = _rollout(monkeypatch)
  assert calls == [0]
  for ro in (cont, one):
    np.testing.assert_array_equal(ro.tokens, static.tokens)
    np.testing.assert_array_equal(ro.mask, static.mask)
    np.testing.assert_allclose(ro.logp, static.logp, rtol=1e-5, atol=1e-6)
    assert list(ro.finish_reasons) == list(static.finish_reasons)


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_a_long_rollout_reports_the_sequences_sampled(
  monkeypatch, capsys, batching
):
  """The loop's rollout progress (context.step_progress, due at once
  here) reaches the sampler through Context.generate: one line per host
  call of 4 decode steps (static or continuous) and per static call but
  the last; the samples are the ones drawn without it."""
  monkeypatch.setattr(context_lib, "PROGRESS_SECONDS", 0.0)
  monkeypatch.setattr(engine, "PROGRESS_STEPS", 4)
  ctx = _context(rollout_rows=5, rollout_batching=batching)
  examples = data_lib.load(EXAMPLES, "train")
  quiet = testing.tiny_rollout(ctx, examples)
  assert capsys.readouterr().err == ""
  # Another process passes a callback that prints nothing: the same calls.
  with monkeypatch.context() as m:
    m.setattr(context_lib.jax, "process_index", lambda: 1)
    other = context_lib.step_progress(2, 3, "rollout sequences", 16)
  testing.tiny_rollout(ctx, examples, progress=other)
  assert capsys.readouterr().err == ""
  ro = testing.tiny_rollout(
    ctx,
    examples,
    progress=context_lib.step_progress(2, 3, "rollout sequences", 16),
  )
  np.testing.assert_array_equal(ro.tokens, quiet.tokens)
  np.testing.assert_allclose(ro.logp, quiet.logp, rtol=1e-6, atol=1e-6)
  err = capsys.readouterr().err
  done = [
    int(n)
    for n in re.findall(
      r"^step 3/3: rollout sequences (\d+)/16 \| \d+:\d\d elapsed, ETA ",
      err,
      re.M,
    )
  ]
  assert len(done) == len(err.splitlines()), err
  # Rows finished so far, 5 at a time at most in flight; static calls
  # report within (every 4 decode steps) and after each but the last.
  assert len(done) >= 2 and done == sorted(done) and done[-1] < 16, done
  if batching == "static":
    assert {5, 10, 15} <= set(done) and len(done) > 3, done


def test_a_custom_generate_fn_gets_the_rollout_progress():
  """Multi-turn episodes and trees (a generate_fn) report through the
  same callback (multiturn_test, tree_test: what they report)."""
  seen = []

  def generate_fn(ctx, params, examples, rng, step, **kw):
    seen.append(kw.pop("progress"))
    return "episodes"

  ctx = testing.tiny_context(grpo.TinyConfig(), generate_fn=generate_fn)
  report = lambda done: None  # noqa: E731
  examples = data_lib.load(EXAMPLES, "train")
  assert testing.tiny_rollout(ctx, examples, progress=report) == "episodes"
  assert seen == [report]


def test_bad_batching_is_a_config_error():
  with pytest.raises(ValueError, match="--rollout_batching='paged'"):
    dataclasses.replace(grpo.TinyConfig(), rollout_batching="paged").validate()


def test_ragged_decode_attention_samples_as_dense(monkeypatch):
  """--decode_attention=ragged reaches the loop's single-turn sampler (the
  Pallas decode kernel, interpret mode here) with the same samples."""
  dense, _ = _rollout(monkeypatch, rollout_rows=5)
  ragged, _ = _rollout(monkeypatch, rollout_rows=5, decode_attention="ragged")
  np.testing.assert_array_equal(ragged.tokens, dense.tokens)
  np.testing.assert_array_equal(ragged.mask, dense.mask)
  np.testing.assert_allclose(ragged.logp, dense.logp, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="--decode_attention='paged'"):
    dataclasses.replace(grpo.TinyConfig(), decode_attention="paged").validate()


def test_auto_decode_attention_is_resolved_for_the_runs_mesh(monkeypatch):
  """The default --decode_attention=auto reaches the single-turn sampler as
  the implementation attention.resolve_decode picks for the context's
  mesh: dense on this CPU, ragged where that says so (a GPU)."""
  assert grpo.TinyConfig().decode_attention == "auto"
  ctx = testing.tiny_context(grpo.TinyConfig())
  assert ctx.rollout_model_cfg.decode_attention == "dense"
  seen = []

  def resolve(decode, mesh=None):
    seen.append((decode, mesh))
    return "ragged"

  monkeypatch.setattr(attention, "resolve_decode", resolve)
  assert ctx.rollout_model_cfg.decode_attention == "ragged"
  assert seen == [("auto", ctx.mesh)]


def test_config_choices_are_the_models():
  """config.py names the model's choices without importing JAX; they must
  stay the ones the model accepts."""
  assert config.DECODE_ATTENTIONS == ("auto",) + (
    attention.DECODE_IMPLEMENTATIONS
  )
  assert config.REMAT_POLICIES == tuple(blocks.REMAT_POLICIES)
  assert config.TEMPLATES == tokenizer.TEMPLATES


def test_rollout_layout_reaches_the_runs_sampler():
  """--rollout_layout reaches the single-turn sampler's architecture
  (Context.rollout_model_cfg, whose rollout_layout.on_mesh lays the
  weights out by it); a bad value is a config error naming the flag."""
  assert grpo.TinyConfig().rollout_layout == "auto"
  cfg = dataclasses.replace(grpo.TinyConfig(), rollout_layout="fsdp")
  assert testing.tiny_context(cfg).rollout_model_cfg.rollout_layout == "fsdp"
  with pytest.raises(ValueError, match="--rollout_layout='tp'"):
    dataclasses.replace(grpo.TinyConfig(), rollout_layout="tp").validate()


def test_rollout_tensor_reaches_the_runs_samplers():
  """--rollout_tensor reaches the single-turn sampler's architecture
  (Context.rollout_model_cfg; rollout.generate decodes on
  rollout_layout.sampling_mesh of it) and the multi-turn and tree
  samplers' (Context.segments_model_cfg: the run's rollout flags, the
  dense decode attention their segments take, whatever
  --decode_attention says); loop_test: one that does not divide the
  run's devices stops the run before the model loads."""
  assert grpo.TinyConfig().rollout_tensor == 0
  cfg = dataclasses.replace(
    grpo.TinyConfig(),
    rollout_tensor=2,
    rollout_layout="fsdp",
    decode_attention="ragged",
  )
  ctx = testing.tiny_context(cfg)
  assert ctx.rollout_model_cfg.rollout_tensor == 2
  assert ctx.rollout_model_cfg.decode_attention == "ragged"
  segments = ctx.segments_model_cfg
  assert (segments.rollout_tensor, segments.rollout_layout) == (2, "fsdp")
  assert segments.decode_attention == "dense"


def test_the_rollout_journal_keeps_the_policys_rows_only(monkeypatch, tmp_path):
  """Context.rollout_journal is the policy's (the loop's step directory,
  whose weights are its checkpoint's): a rollout of other weights (a
  teacher's, a copy of the policy's) is never journaled, so that it
  cannot take the policy's rows."""
  ctx = _context()
  ctx.rollout_journal = str(tmp_path / "step_0")
  seen = []
  monkeypatch.setattr(
    rollout_lib, "generate", lambda *a, **k: seen.append(k["journal"])
  )
  examples = data_lib.load(EXAMPLES, "train")
  testing.tiny_rollout(ctx, examples)  # the policy's
  ctx.generate(
    dict(ctx.params), examples, None, 0, group_size=1, sampling=None
  )  # equal weights, another object (a teacher's would be)
  assert seen == [str(tmp_path / "step_0"), None]
