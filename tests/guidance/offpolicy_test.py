"""Hand-computed tests of rlreason/guidance/offpolicy.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import grpo
from rlreason.data import allocation
from rlreason.data import sources as data_lib
from rlreason.guidance import offpolicy as guidance
from rlreason.guidance import resampling as guided
from rlreason.guidance import hints
from rlreason import testing


def test_encode_traces():
  out = guidance.encode_traces(
    [[5, 6], [7]], [[1, 2, 3, 9], [4, 9]], pad_id=0, max_new_tokens=3
  )
  # bucket 32: prompts left padded to 32; completions truncated to T = 3.
  tok, pos = out["tokens"], out["positions"]
  assert tok.shape == (2, 35)
  np.testing.assert_array_equal(tok[:, 30:], [[5, 6, 1, 2, 3], [0, 7, 4, 9, 0]])
  np.testing.assert_array_equal(
    pos[:, 30:], [[0, 1, 2, 3, 4], [-1, 0, 1, 2, -1]]
  )
  np.testing.assert_array_equal(out["mask"], [[1, 1, 1], [1, 1, 0]])


def test_replace_rows_pads_and_marks_off_policy():
  batch = {
    "tokens": np.array([[1, 2, 3], [4, 5, 6]]),
    "positions": np.array([[0, 1, 2], [0, 1, 2]]),
    "mask": np.ones((2, 1), np.float32),
    "adv": np.array([1.0, 2.0], np.float32),
  }
  other = {
    "tokens": np.array([[7, 8, 9, 1]]),
    "positions": np.array([[0, 1, 2, 3]]),
    "mask": np.zeros((1, 1), np.float32),
    "off_policy": np.ones(1, np.float32),
  }
  out = guidance.replace_rows(batch, [1], other, pad_id=0)
  np.testing.assert_array_equal(out["tokens"], [[0, 1, 2, 3], [7, 8, 9, 1]])
  np.testing.assert_array_equal(out["positions"], [[-1, 0, 1, 2], [0, 1, 2, 3]])
  np.testing.assert_array_equal(out["mask"], [[1], [0]])
  np.testing.assert_array_equal(out["adv"], [1.0, 0.0])  # missing -> 0
  np.testing.assert_array_equal(out["off_policy"], [0, 1])
  np.testing.assert_array_equal(batch["adv"], [1.0, 2.0])  # not mutated


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("gamma", [0.0, 0.1])
def test_mixed_policy_loss(jit, gamma):
  logp = jnp.log(jnp.array([[0.5, 0.5], [0.4, 0.2]]))
  old = jnp.log(jnp.array([[0.5, 0.5], [0.2, 0.4]]))
  adv = jnp.array([1.0, 2.0])
  mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
  off = jnp.array([0.0, 1.0])

  def f(lp):
    per_token, m = guidance.mixed_policy_loss(
      lp, old, adv, mask, off_policy=off, shaping_gamma=gamma, max_ratio=1.5
    )
    return per_token, m

  fn = jax.jit(f) if jit else f
  per_token, m = fn(logp)
  r = np.array([2.0, 0.5])  # off-policy row's ratios
  w = r / (r + gamma) if gamma else np.minimum(r, 1.5)
  expected = [[-1.0, -1.0], [-2.0 * w[0], 0.0]]
  np.testing.assert_allclose(per_token, expected, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    m["offpolicy_ratio"], [[0, 0], [2.0, 0.5]], rtol=1e-6, atol=1e-6
  )
  # Gradient of the off-policy token: -A f'(r) r.
  grad = jax.grad(lambda lp: f(lp)[0].sum())(logp)
  g = -2.0 * (gamma * r[0] / (r[0] + gamma) ** 2 if gamma else 0.0)
  np.testing.assert_allclose(grad[1, 0], g, rtol=1e-5, atol=1e-7)
  # PPO, r = 1
  np.testing.assert_allclose(grad[0], [-1.0, -1.0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_mixed_policy_loss_quantile_gamma(jit):
  # Guide's "percentile" gamma: the q-quantile of the off-policy rows'
  # valid-token ratios, no gradient. Off rows' ratios 1, 2, 4 (the masked
  # 100 is ignored): the median is 2, so w = r / (r + 2) = 1/3, 1/2, 2/3;
  # the on-policy row is PPO's (r = e^1 = 2.72 clipped at 1.2).
  logp = jnp.log(jnp.array([[1.0, 2.0], [4.0, 100.0], [np.e, np.e]]))
  old = jnp.zeros((3, 2))
  adv = jnp.array([1.0, 1.0, 1.0])
  mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
  off = jnp.array([1.0, 1.0, 0.0])

  def f(lp):
    return guidance.mixed_policy_loss(
      lp, old, adv, mask, off_policy=off, gamma_quantile=0.5
    )[0]

  fn = jax.jit(f) if jit else f
  np.testing.assert_allclose(
    fn(logp),
    [[-1 / 3, -1 / 2], [-2 / 3, 0.0], [-1.2, -1.2]],
    rtol=1e-6,
    atol=1e-6,
  )
  # d/dlogp of -r / (r + gamma) with gamma held: -gamma r / (r + gamma)^2.
  grad = jax.grad(lambda lp: f(lp).sum())(logp)
  np.testing.assert_allclose(grad[0], [-2 / 9, -4 / 16], rtol=1e-5, atol=1e-7)


def test_mixed_policy_loss_dual_clips_on_policy_rows_only():
  """AMPO's on-policy rows are dual-clipped (clip_ratio_c 10): a token of
  advantage -1 at ratio e^3 = 20.1 loses min(20.1, 10) = 10; an off-policy
  row at the same ratio keeps its shaped weight r / (r + 0.1)."""
  logp = jnp.full((2, 1), 3.0)
  old = jnp.zeros((2, 1))
  adv = jnp.array([-1.0, -1.0])
  mask = jnp.ones((2, 1))
  off = jnp.array([0.0, 1.0])
  r = np.exp(3.0)
  for dual_clip, on_loss in ((None, r), (10.0, 10.0)):
    per_token, _ = guidance.mixed_policy_loss(
      logp,
      old,
      adv,
      mask,
      off_policy=off,
      shaping_gamma=0.1,
      dual_clip=dual_clip,
    )
    np.testing.assert_allclose(
      per_token, [[on_loss], [r / (r + 0.1)]], rtol=1e-5, atol=1e-6
    )


def test_replacement_rows():
  take = np.array([True, False, True])
  correct = np.array([0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1])
  # Whole groups, row for row (Guide, GHPO): groups 0 and 2.
  dst, src = guided.replacement_rows(take, correct, 4)
  np.testing.assert_array_equal(dst, [0, 1, 2, 3, 8, 9, 10, 11])
  np.testing.assert_array_equal(src, dst)
  # EGSR: up to 2 correct hinted rows into the group's last rows.
  dst, src = guided.replacement_rows(take, correct, 4, 2, correct_only=True)
  np.testing.assert_array_equal(dst, [3, 2, 11])
  np.testing.assert_array_equal(src, [1, 2, 11])
  # Without correct_only: the first k hinted rows, whatever their outcome.
  dst, src = guided.replacement_rows(take, correct, 4, 1)
  np.testing.assert_array_equal(dst, [3, 11])
  np.testing.assert_array_equal(src, [0, 8])
  # No correct hinted row: nothing is replaced.
  dst, src = guided.replacement_rows(
    take, np.zeros(12), 4, 2, correct_only=True
  )
  assert dst.size == src.size == 0


def test_subset_bucket():
  sizes = [guided.subset_bucket(n, 16) for n in (1, 2, 3, 5, 9, 16)]
  assert sizes == [1, 2, 4, 8, 16, 16]
  assert guided.subset_bucket(5, 6) == 6


def test_guided_rollouts_resample_only_the_hinted_prompts(monkeypatch):
  cfg = grpo.TinyConfig(
    batch_size=6,
    group_size=2,
    max_new_tokens=8,
    max_prompt_len=64,
    warm_start_steps=0,
    mesh_fsdp=1,
  )
  ctx = testing.tiny_context(cfg)
  examples = data_lib.load(cfg.data, "train")[:6]
  rollout = testing.tiny_rollout(ctx, examples)
  before = ctx.batch_from_rollout(rollout)
  r0, _ = ctx.score(rollout, examples)
  sampled = []
  sample_again = allocation.sample_again

  def spy(ctx, exs, round_, **kw):
    sampled.append([e.uid for e in exs])
    return sample_again(ctx, exs, round_, **kw)

  monkeypatch.setattr(allocation, "sample_again", spy)
  picked = {examples[i].uid for i in (1, 3, 4)}

  def hint_fn(e, ctx):
    return hints.with_hint(e, hint="hint: x") if e.uid in picked else None

  batch, total, _, hinted = guided.guided_rollouts(
    rollout, examples, ctx, [hint_fn], select="all"
  )
  # One stage, the 3 hinted prompts padded to 4 with the first of them.
  uids = [examples[i].uid for i in (1, 3, 4, 1)]
  assert sampled == [uids]
  np.testing.assert_array_equal(hinted, np.repeat([0, 1, 0, 1, 1, 0], 2) > 0)
  pad = ctx.tokenizer.pad_id
  for i in range(12):
    ids = [t for t in batch["tokens"][i] if t != pad]
    if hinted[i]:  # a hinted sample of its own group's prompt
      text = ctx.tokenizer.decode(ids)
      assert f"hint: x\n{examples[i // 2].question}" in text
    else:  # round 0's row, untouched
      assert ids == [t for t in before["tokens"][i] if t != pad]
      assert total[i] == r0[i]
