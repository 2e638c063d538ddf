"""rlreason/eval/teacher.py and rlreason/guidance/resampling.py against a tiny
random model."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config
from rlreason import testing
from rlreason.guidance import resampling as guided
from rlreason.guidance import hints
from rlreason.model import policy
from rlreason.eval import teacher as teacher_lib
from rlreason.eval import trained
from rlreason.model import tokenizer as tokenizer_lib


def _ctx(**fields):
  cfg = dataclasses.replace(config.BaseConfig(), model="tiny", **fields)
  return testing.tiny_context(cfg)


def _rollout(n=3):
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 50, (n, 6)).astype(np.int32)
  positions = np.tile(np.arange(6, dtype=np.int32), (n, 1))
  return types.SimpleNamespace(
    tokens=tokens, positions=positions, mask=np.ones((n, 2), np.int32)
  )


def test_teacher_logp_matches_the_same_model():
  ctx = _ctx()
  t = teacher_lib.Teacher("tiny")
  model_cfg, params = t.load(ctx)
  assert t.load(ctx)[1] is params  # loaded once
  rollout = _rollout()
  want = policy.completion_logprobs(
    params, rollout.tokens, rollout.positions, model_cfg, 4
  )
  np.testing.assert_allclose(t.logp(ctx, rollout), want, rtol=1e-5, atol=1e-5)
  # Same seed and preset as trained.load: the same random weights, bit for
  # bit (the same initialiser program).
  same = trained.load("tiny", mesh=ctx.mesh, seed=ctx.cfg.seed).params
  jax.tree.map(np.testing.assert_array_equal, same, params)


def test_teacher_scores_by_micro_batch_in_the_compute_dtype(monkeypatch):
  """The teacher scores the rollout as the loop scores the reference (one
  train micro-batch of rows per forward, Context.completion_scores: the
  planner's teacher program), its weights frozen in the compute dtype."""
  ctx = _ctx(dtype="bfloat16", batch_size=2, group_size=2, micro_batches=2)
  assert ctx.score_rows == 2
  t = teacher_lib.Teacher("tiny")
  model_cfg, params = t.load(ctx)
  dtypes = {x.dtype for x in jax.tree.leaves(params)}
  assert dtypes == {jnp.dtype(jnp.bfloat16)}, dtypes
  seen = []
  forward = policy.completion_logprobs

  def spy(params, tokens, *args, **kwargs):
    seen.append(tokens.shape[0])
    return forward(params, tokens, *args, **kwargs)

  monkeypatch.setattr(policy, "completion_logprobs", spy)
  rollout = _rollout(n=5)
  got = t.logp(ctx, rollout)
  assert got.shape == (5, 2) and seen and max(seen) <= 2, seen
  want = forward(params, rollout.tokens, rollout.positions, model_cfg, 4)
  np.testing.assert_allclose(
    got, np.asarray(want, np.float32), rtol=1e-6, atol=1e-6
  )


def test_a_teacher_of_another_architecture_samples_by_its_own():
  """A teacher of another shape than the policy (the "small" preset,
  Qwen2-style, under a "tiny" Llama-style policy) samples with its own
  architecture: its greedy completion's first token is the argmax of its
  own logits after the prompt."""
  from rlreason.data import sources as data_lib

  ctx = _ctx(temperature=0.0, max_new_tokens=2)
  t = teacher_lib.Teacher("small")
  model_cfg, params = t.load(ctx)
  assert model_cfg.d_model != ctx.model_cfg.d_model
  examples = [data_lib.Example("a", "12+30=", "42")]
  ro = t.generate(ctx, examples, jax.random.key(0), group_size=1)
  (prompt,) = ctx.encode_prompts(examples)
  logits = policy.logits(params, jnp.asarray([prompt], jnp.int32), model_cfg)
  first = np.asarray(ro.tokens)[0, ro.prompt_len]
  assert first == int(jnp.argmax(logits[0, -1])), (first, logits[0, -1])
  # A run whose sampler is replaced (multi-turn episodes) cannot sample
  # another model's architecture through it.
  ctx.generate_fn = lambda *args, **kwargs: None
  with pytest.raises(ValueError, match="single-turn sampler"):
    t.generate(ctx, examples, jax.random.key(0), group_size=1)


def test_unsolved():
  np.testing.assert_array_equal(
    guided.unsolved(np.array([0, 0, 1, 0, 0, 0]), 2), [True, False, True]
  )


def test_unhinted_batch_rebases_to_the_plain_prompt():
  tok = tokenizer_lib.load("char")
  cfg = types.SimpleNamespace(template="plain")

  def encode(examples):
    return [
      tok.encode(hints.prompt_text(tok, e, cfg.template)) for e in examples
    ]

  ctx = types.SimpleNamespace(encode_prompts=encode, tokenizer=tok, cfg=cfg)
  from rlreason.data import sources as data_lib

  ex = [hints.with_hint(data_lib.Example("u", "1+2=", "3"), hint="hint: h")]
  hinted = encode(ex)[0]
  comp = tok.encode("3")
  tokens = np.array([hinted + comp])
  positions = np.array([list(range(len(hinted) + 1))])
  batch = {"tokens": tokens, "positions": positions, "old_logp": np.zeros(1)}
  ro = types.SimpleNamespace(prompt_len=len(hinted), prompt_ids=np.array([0]))
  out = hints.unhinted_batch(batch, ro, ex, ctx)
  assert out["tokens"].tolist() == [tok.encode("1+2=") + comp]
  assert out["positions"].tolist() == [[0, 1, 2, 3, 4]]
  assert out["old_logp"] is batch["old_logp"]


def test_a_warm_start_teacher_needs_sft_steps():
  # 0 and 0: the untrained model, the policy's own start (the shipped base).
  with pytest.raises(ValueError, match="--teacher_steps"):
    teacher_lib.check("warm_start", 0, 0)
  teacher_lib.check("warm_start", 200, 0)
  teacher_lib.check("warm_start", 0, 600)
  teacher_lib.check("/ckpt/a_teacher", 0, 0)
