"""Every experiment smoke-runs for 2 steps.

A run killed with SIGKILL resumes exactly: tests/train/tracker_resume_test.py,
on adacl, whose prompt iterator carries the most state.
"""

import dataclasses
import importlib
import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import plan_hooks
from rlreason import testing

# Small enough for seconds on CPU; keeps each method's algorithmic choices.
SMOKE = testing.SMOKE

# Every paper method but pretrain (the laptop base, tests/pretrain_test.py).
EXPERIMENTS = [n for n in plan_hooks.experiment_names() if n != "pretrain"]
# Smoke-run by their own tests below, which also make test_smoke's checks
# (dars as its dars_b variant: the same code with the variant's preset).
OWN_SMOKE_TEST = ("rm_grpo", "dars", "knowrl", "rlpr")


def _check_smoke_run(module, tmp_path, out) -> list[dict]:
  """2 finite steps, the run's files, a valid paper preset; the train rows."""
  rows = [json.loads(line) for line in open(tmp_path / "run/metrics.jsonl")]
  train = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train] == [1, 2]
  assert all(np.isfinite(r["loss"]) for r in train)
  assert "eval/accuracy" in out
  for f in ("config.json", "COMMIT", "eval_before.json", "eval_after.json"):
    assert os.path.exists(tmp_path / "run" / f), f
  if hasattr(module, "PAPER"):  # --scale=paper must name real fields.
    dataclasses.replace(module.Config(), **module.PAPER).validate()
  return train


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
  """One cache directory per test process (each xdist worker has its own):
  the smoke runs whose warm-start settings agree (24 of them) train it
  once and load it after, as a user's reruns do."""
  return str(tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize(
  "name", [n for n in EXPERIMENTS if n not in OWN_SMOKE_TEST]
)
def test_smoke(name, tmp_path, shared_cache):
  module = importlib.import_module(f"experiments.{name}")
  cfg = dataclasses.replace(
    module.Config(),
    **SMOKE,
    workdir=str(tmp_path / "run"),
    cache_dir=shared_cache,
  )
  _check_smoke_run(module, tmp_path, module.run(cfg))


def test_rm_grpo_logs_proxy_and_gold_and_reuses_its_reward_model(
  tmp_path, monkeypatch
):
  from experiments import rm_grpo

  steps = []  # train_bt's micro-batches, compile options, pairs' prompts
  train_bt = rm_grpo.bt.train_bt

  def spy(*args, **kwargs):
    g = kwargs["groups"]  # --rm_batching=prompt: the pairs' prompts
    steps.append((kwargs["micro_batches"], kwargs["compiler_options"], g))
    if len(steps) == 1:  # the first run is stopped as its RM trains
      raise KeyboardInterrupt
    return train_bt(*args, **kwargs)

  monkeypatch.setattr(rm_grpo.bt, "train_bt", spy)
  sampled = testing.spy(
    monkeypatch, rm_grpo.rm_stage, "preference_data", lambda *a: len(a)
  )

  cfg = dataclasses.replace(
    rm_grpo.Config(),
    **SMOKE,
    rm_prompts=8,
    rm_samples=2,
    rm_steps=3,
    rm_micro_batches=2,  # the pairs of a step in two micro-batches
    rm_weight=0.5,
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  with pytest.raises(KeyboardInterrupt):
    rm_grpo.run(cfg)
  (partial,) = [p for p in os.listdir(tmp_path / "cache") if "partial" in p]
  assert "data.npz" in os.listdir(tmp_path / "cache" / partial)
  # The rerun trains on the samples the stopped run kept.
  train = _check_smoke_run(rm_grpo, tmp_path, rm_grpo.run(cfg))
  assert len(sampled) == 1 and not (tmp_path / "cache" / partial).exists()
  # The policy's --train_temp_budget_mib as train_step.compiler_options
  # gives it (none on CPU; model_test: the options reach the compile).
  assert [s[:2] for s in steps] == [(2, None)] * 2, steps
  for r in train:  # the proxy and the gold reward, every step
    assert np.isfinite(r["reward/rm"]) and 0 <= r["accuracy"] <= 1
    mixed = 0.5 * r["reward/rm"] + 0.5 * r["reward/verifier"]
    np.testing.assert_allclose(r["reward"], mixed, rtol=1e-5, atol=1e-5)
  info = json.load(open(tmp_path / "run/reward_model.json"))
  assert info["sample_accuracy"] is not None and "heldout_pair_accuracy" in info
  # InstructGPT's batching: each training pair's prompt (prompt-major).
  groups = steps[1][2]
  assert len(groups) == info["pairs_train"], (groups, info)
  assert np.all(np.diff(groups) >= 0) and np.all(groups < cfg.rm_prompts)
  (cached,) = [p for p in os.listdir(tmp_path / "cache") if p.startswith("rm-")]
  # A rerun loads the cached RM: with no context or policy to sample from,
  # retraining would fail.
  _, again = rm_grpo.rm_stage.cached_reward_model(
    rm_grpo.sft.warm_started(cfg), None, None
  )
  assert again == info and os.listdir(tmp_path / "cache").count(cached) == 1


def test_rm_grpo_judge_samples_its_verdicts_as_the_run_samples(
  tmp_path, shared_cache, monkeypatch
):
  """--rm_kind=judge: the frozen warm-start policy judges each response
  (its verdicts sampled on the run's mesh, in the run's sampler calls:
  Context.sampler_kwargs), the proxy reward a mean verdict in [0, 1],
  mixed with the verifier's as the scalar reward model's is. In a bf16 run
  its frozen weights are kept in bf16, as the reference's are."""
  from experiments import rm_grpo
  from rlreason.rewards import judge as judge_lib

  seen = []
  judge = judge_lib.judge

  def spy(params, *args, **kwargs):
    seen.append(dict(kwargs, dtypes={x.dtype for x in jax.tree.leaves(params)}))
    return judge(params, *args, **kwargs)

  monkeypatch.setattr(judge_lib, "judge", spy)
  cfg = dataclasses.replace(
    rm_grpo.Config(),
    **SMOKE,
    rm_kind="judge",
    judge_samples=2,
    judge_temperature=1.0,
    dtype="bfloat16",  # master weights float32 (--param_dtype)
    rm_weight=0.5,
    workdir=str(tmp_path / "run"),
    cache_dir=shared_cache,
  )
  train = _check_smoke_run(rm_grpo, tmp_path, rm_grpo.run(cfg))
  for r in train:
    assert 0 <= r["reward/rm"] <= 1 and 0 <= r["accuracy"] <= 1
    mixed = 0.5 * r["reward/rm"] + 0.5 * r["reward/verifier"]
    np.testing.assert_allclose(r["reward"], mixed, rtol=1e-5, atol=1e-5)
  assert len(seen) == 2, seen  # one judging call per step
  for kw in seen:
    assert kw["mesh"] is not None and kw["samples"] == 2, kw
    assert kw["batching"] == cfg.rollout_batching
    assert kw["rows_per_call"] == cfg.rollout_rows
    assert kw["dtypes"] == {jnp.dtype(jnp.bfloat16)}, kw["dtypes"]


def test_rm_grpo_rejects_micro_batches_that_do_not_divide_its_pairs():
  from experiments import rm_grpo

  bad = dataclasses.replace(rm_grpo.Config(), rm_micro_batches=3)
  with pytest.raises(
    ValueError, match="--rm_micro_batches=3 must .*--rm_batch_size=32"
  ):
    bad.validate()
  dataclasses.replace(bad, rm_batch_size=33).validate()


@pytest.mark.parametrize("zero_truncated", [False, True])
def test_dr_grpo_zero_truncated_gives_cut_off_completions_reward_0(
  zero_truncated,
):
  from experiments import dr_grpo
  from rlreason.data.sources import Example

  cfg = dr_grpo.Config(group_size=2, zero_truncated=zero_truncated)
  rollout = types.SimpleNamespace(
    texts=["1", "1", "1", "2"],
    lengths=np.array([3, 5, 2, 5]),
    finish_reasons=np.array(["eos", "length", "eos", "eos"]),
    prompt_ids=np.array([0, 0, 1, 1]),
  )
  examples = [Example("0", "q", "1"), Example("1", "q", "1")]
  scores = np.array([1.0, 1.0, 1.0, 0.0], np.float32)  # the verifier's
  ctx = types.SimpleNamespace(
    cfg=cfg,
    correct_fn=lambda texts, gold: scores,
    score=lambda r, ex: (scores, {"math": scores}),
    batch_from_rollout=lambda r: {
      "mask": np.ones((4, 5), np.float32),
      "old_logp": np.zeros((4, 5), np.float32),
    },
  )
  batch, m = dr_grpo.make_batch(rollout, examples, ctx)
  # Dr. GRPO: A = r - mean(group). Row 1 ran out of tokens: with the flag
  # its reward is 0, so r = [1, 0 | 1, 0]; without, r = [1, 1 | 1, 0].
  want = [0.5, -0.5, 0.5, -0.5] if zero_truncated else [0.0, 0.0, 0.5, -0.5]
  np.testing.assert_allclose(batch["adv"], want, rtol=1e-6, atol=1e-6)
  assert m["reward"] == pytest.approx(
    0.5 if zero_truncated else 0.75, rel=1e-6, abs=1e-6
  )
  assert m["reward/math"] == pytest.approx(0.75, rel=1e-6, abs=1e-6)
  assert dr_grpo.PAPER["zero_truncated"]  # the authors' code does it


def test_ppo_zero_truncated_zeroes_the_cut_rows_returns():
  """ORZ: a response that does not stop earns 0; with gamma = lam = 1
  every token's return is then 0 (the others keep their reward)."""
  from experiments import ppo
  from rlreason.data import sources as data_lib
  from rlreason.rl import value

  sizes = dict(batch_size=2, group_size=2, max_new_tokens=6)
  ctx = testing.tiny_context(ppo.Config(**sizes, zero_truncated=True))
  ctx.extra = {value.KEY: value.init(ctx.model_cfg, jax.random.key(1))}
  examples = data_lib.load(ctx.cfg.data, "train")[:2]
  rollout = testing.tiny_rollout(ctx, examples)
  ctx.score = lambda r, ex: (np.ones(4, np.float32), {})
  # Row 0 ran out of tokens; the others stopped.
  rollout = rollout._replace(
    finish_reasons=np.where(np.arange(4) == 0, "length", "eos")
  )
  batch, _ = ppo.make_batch(rollout, examples, ctx)
  mask = batch["mask"] > 0
  np.testing.assert_array_equal(batch["returns"][0][mask[0]], 0.0)
  for i in (1, 2, 3):  # stopped: return 1 on every token (V starts at 0)
    np.testing.assert_allclose(
      batch["returns"][i][mask[i]], 1.0, rtol=1e-6, atol=1e-6
    )
  assert ppo.PAPER["zero_truncated"]


def test_ppo_critic_takes_its_own_updates(tmp_path, shared_cache, monkeypatch):
  """--critic_minibatches (ORZ: 1 policy and 12 critic updates a rollout):
  each step runs the policy's updates on the surrogate alone (its loss is
  the pg_loss), then the critic's own, 3 of 5 rows (16 // 3; one row left
  out) on the value loss alone, logged as critic/loss."""
  from experiments import ppo
  from rlreason.train import train_step as ts

  calls, run_updates = [], ts.run_updates

  def counted(step_fn, state, batch, sh, **kw):
    calls.append((kw["minibatches"], kw.get("rows", 0)))
    return run_updates(step_fn, state, batch, sh, **kw)

  monkeypatch.setattr(ts, "run_updates", counted)
  cfg = dataclasses.replace(
    ppo.Config(),
    **SMOKE,
    minibatches=1,
    critic_minibatches=3,
    workdir=str(tmp_path / "run"),
    cache_dir=shared_cache,
  )
  train = _check_smoke_run(ppo, tmp_path, ppo.run(cfg))
  assert calls == [(1, 0), (3, 5)] * 2
  for row in train:
    assert row["loss"] == row["pg_loss"]
    assert np.isfinite(row["critic/loss"]) and np.isfinite(row["value_loss"])
  with pytest.raises(ValueError, match="--critic_minibatches=17"):
    dataclasses.replace(cfg, critic_minibatches=17).validate()


@pytest.mark.parametrize(
  "selection, dual_clip", [("top", 0.0), ("bottom", 0.0), ("all", 1.5)]
)
def test_forking_tokens_divides_by_the_tokens_it_keeps(selection, dual_clip):
  from experiments import forking_tokens
  from rlreason.model import policy
  from rlreason.model import transformer
  from rlreason.rl import aggregation
  from rlreason.rl import losses

  cfg = forking_tokens.Config(
    token_selection=selection, top_frac=0.2, dual_clip=dual_clip
  )
  model_cfg = testing.tiny_model_config()
  params = transformer.init(model_cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  n, p, t = 3, 2, 4
  mask = np.ones((n, t), np.float32)
  mask[1, 2:] = 0  # 10 valid tokens: top keeps ceil(0.2 * 10) = 2
  batch = {
    "tokens": jnp.asarray(rng.integers(3, model_cfg.vocab_size, (n, p + t))),
    "positions": jnp.broadcast_to(jnp.arange(p + t), (n, p + t)),
    "mask": jnp.asarray(mask),
    # Row 1's ratios are e^1.5 = 4.5 > 1.5: its negative advantage's loss
    # is capped at -adv * 1.5 by the dual clip (when on).
    "old_logp": jnp.asarray(rng.normal(-2.0, 0.3, (n, t)), jnp.float32),
    "adv": jnp.asarray([1.0, -0.5, 0.25]),
  }
  logp, entropy = policy.completion_logprobs(
    params, batch["tokens"], batch["positions"], model_cfg, p, with_entropy=True
  )
  batch["old_logp"] = batch["old_logp"].at[1].set(logp[1] - 1.5)
  loss, _ = forking_tokens.loss_fn(
    params,
    batch,
    aggregation.normalizers(batch["mask"]),
    cfg=cfg,
    model_cfg=model_cfg,
  )
  per_token, _ = losses.clipped_surrogate(
    logp,
    batch["old_logp"],
    batch["adv"],
    batch["mask"],
    clip_eps_low=0.2,
    clip_eps_high=0.28,
  )
  if dual_clip:  # min(clipped loss, -adv * c) where adv < 0, by hand
    per_token = per_token.at[1].set(jnp.minimum(per_token[1], 0.5 * 1.5))
    assert float(per_token[1, 0]) == pytest.approx(0.75, rel=1e-6, abs=1e-6)
  # The 2 highest-entropy valid tokens, by numpy.
  h = np.where(mask > 0, np.asarray(entropy), -np.inf).reshape(-1)
  top = np.zeros(n * t, bool)
  top[np.argsort(-h, kind="stable")[:2]] = True
  top = top.reshape(n, t)
  kept = {"top": top, "bottom": (mask > 0) & ~top, "all": mask > 0}[selection]
  want = np.sum(np.asarray(per_token)[kept]) / kept.sum()  # 2, 8 or 10
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  "bounds, kept",
  [
    ({}, [1, 1, 1]),
    ({"entropy_max": np.log(4)}, [1, 1, 0]),  # ln G: all 4 answers differ
    ({"entropy_min": 0.6}, [0, 0, 1]),
    ({"entropy_min": 0.5, "entropy_max": np.log(4)}, [0, 1, 0]),
  ],
)
def test_empo_drops_prompts_outside_its_entropy_band(bounds, kept):
  from experiments import empo
  from rlreason.data.sources import Example

  cfg = empo.Config(group_size=4, **bounds)
  cfg.validate()
  # Prompt 0: one answer (H = 0); 1: three and one (H = -(0.75 ln 0.75 +
  # 0.25 ln 0.25) = 0.562); 2: four different answers (H = ln 4).
  answers = ["1", "1", "1", "1", "2", "2", "2", "3", "4", "5", "6", "7"]
  rollout = types.SimpleNamespace(
    texts=[f"answer: {a}" for a in answers],
    lengths=np.full(12, 3),
    finish_reasons=np.full(12, "eos"),
    prompt_ids=np.repeat(np.arange(3), 4),
  )
  examples = [Example(str(i), "q", "1") for i in range(3)]
  ctx = types.SimpleNamespace(
    cfg=cfg,
    correct_fn=lambda t, gold: np.array([a == b for a, b in zip(t, gold)]),
    batch_from_rollout=lambda r: {
      "mask": np.ones((12, 3), np.float32),
      "old_logp": np.zeros((12, 3), np.float32),
    },
    ref_logp=lambda r: np.zeros((12, 3), np.float32),
  )
  batch, m = empo.make_batch(rollout, examples, ctx)
  assert m["empo/semantic_entropy"] == pytest.approx(
    (-(0.75 * np.log(0.75) + 0.25 * np.log(0.25)) + np.log(4)) / 3,
    rel=1e-5,
    abs=1e-6,
  )
  rows = np.repeat(kept, 4)
  np.testing.assert_array_equal(batch["mask"].max(-1), rows)
  # Prompt 1's rewards [0.75, 0.75, 0.75, 0.25] give nonzero advantages
  # where it is kept, zero where dropped.
  assert (np.abs(batch["adv"][4:8]) > 0.1).all() == bool(kept[1])
  assert np.all(batch["adv"][rows == 0] == 0)


def test_empo_rejects_an_empty_entropy_band():
  from experiments import empo

  with pytest.raises(ValueError, match="keeps no prompt"):
    empo.Config(entropy_min=1.0, entropy_max=0.5).validate()


def _dler_batch(**overrides):
  """dler.make_batch on two groups of two 2-token rows: right, wrong |
  right but cut off at the limit, right."""
  from experiments import dler
  from rlreason.data.sources import Example

  cfg = dler.Config(group_size=2, max_new_tokens=2, **overrides)
  correct = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
  rollout = types.SimpleNamespace(
    texts=["a"] * 4,
    lengths=np.array([2, 1, 2, 2]),
    finish_reasons=np.array(["eos", "eos", "length", "eos"]),
    prompt_ids=np.array([0, 0, 1, 1]),
  )
  ctx = types.SimpleNamespace(
    cfg=cfg,
    correct_fn=lambda texts, gold: correct,
    batch_from_rollout=lambda r: {
      "mask": np.ones((4, 2), np.float32),
      "old_logp": np.zeros((4, 2), np.float32),
    },
  )
  examples = [Example("0", "q", "1"), Example("1", "q", "1")]
  return dler.make_batch(rollout, examples, ctx)


def test_dler_truncates_then_whitens_group_centred_rewards_over_tokens():
  batch, _ = _dler_batch()
  # Row 2 is right but cut off: reward 0, so r = [1, 0 | 0, 1], centred
  # [0.5, -0.5 | -0.5, 0.5]. Every token carries its row's return; over
  # the 8 tokens the mean is 0 and the variance (ddof 1) 8 * 0.25 / 7.
  a = 0.5 / np.sqrt(2 / 7 + 1e-8)
  np.testing.assert_allclose(
    batch["adv"], [[a, a], [-a, -a], [-a, -a], [a, a]], rtol=1e-5, atol=1e-6
  )


def test_dler_script_extras_pay_cut_off_answers_and_boost_right_ones():
  """--cutoff_reward_scale pays a right answer cut off at the limit that
  share of 1 (the script's stop_properly_penalty), and
  --correct_advantage_boost adds to every token's advantage of a right
  answer (cut off or not: the score before the cut-off scale, as the
  script's actor reads it) after the whitening."""
  from experiments import dler

  batch, m = _dler_batch(cutoff_reward_scale=0.1, correct_advantage_boost=0.25)
  # r = [1, 0 | 0.1, 1], centred [0.5, -0.5 | -0.45, 0.45]; over the 8
  # tokens the mean is 0 and the variance (ddof 1) 2 * 0.905 / 7; rows 0,
  # 2 and 3 (right, row 2 cut off) then gain 0.25 on each token.
  s = np.sqrt(2 * 0.905 / 7 + 1e-8)
  boosted = np.array([0.25, 0.0, 0.25, 0.25])
  want = np.array([0.5, -0.5, -0.45, 0.45]) / s + boosted
  np.testing.assert_allclose(
    batch["adv"], np.repeat(want[:, None], 2, 1), rtol=1e-5, atol=1e-6
  )
  assert batch["adv"].dtype == np.float32
  assert m["reward"] == pytest.approx(2.1 / 4, rel=1e-6, abs=1e-6)
  with pytest.raises(ValueError, match="cutoff_reward_scale=1.5 must be"):
    dler.Config(cutoff_reward_scale=1.5).validate()


def test_siren_counts_its_entropy_term_once_over_micro_batches():
  """Each micro-batch adds its share of the minibatch's sequences of the
  regulariser, so the summed micro-batch losses hold it once (not once
  per micro-batch)."""
  from experiments import siren
  from rlreason.model import transformer
  from rlreason.rl import aggregation

  cfg = siren.Config(siren_coef=5.0)  # large: the term dominates
  model_cfg = testing.tiny_model_config()
  params = transformer.init(model_cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  n, p, t = 4, 2, 4
  batch = {
    "tokens": jnp.asarray(rng.integers(3, model_cfg.vocab_size, (n, p + t))),
    "positions": jnp.broadcast_to(jnp.arange(p + t), (n, p + t)),
    "mask": jnp.ones((n, t), jnp.float32),
    "old_logp": jnp.asarray(rng.normal(-2.0, 0.3, (n, t)), jnp.float32),
    "adv": jnp.asarray([1.0, -0.5, 0.25, -0.75]),
    "entropy_anchor": jnp.full((n,), 9.0),  # far from the entropy
  }
  whole = aggregation.normalizers(batch["mask"])

  def term(rows, norm):  # the loss minus the policy loss: share * reg
    part = {k: v[rows] for k, v in batch.items()}
    loss, m = siren.loss_fn(params, part, norm, cfg=cfg, model_cfg=model_cfg)
    return float(loss) - float(
      siren.loss_fn(
        params,
        part,
        norm,
        cfg=dataclasses.replace(cfg, siren_coef=0.0),
        model_cfg=model_cfg,
      )[0]
    ), float(m["siren/reg"])

  half, reg = term(slice(0, 2), whole)  # one of two micro-batches
  assert reg > 1.0
  np.testing.assert_allclose(half, 0.5 * reg, rtol=1e-4, atol=1e-5)
  alone, reg_alone = term(
    slice(0, 2), aggregation.normalizers(batch["mask"][:2])
  )
  np.testing.assert_allclose(alone, reg_alone, rtol=1e-4, atol=1e-5)


def test_rlpr_refills_filtered_prompts_and_checkpoints_its_filter(
  tmp_path, shared_cache
):
  """(3) From --std_filter_start on, prompts the std filter drops are
  replaced by fresh ones (at most --refill_rounds rollouts a step), and
  the filter's state is checkpointed with the data's position and the
  prompts put back to be sampled again (none here: nothing is kept)."""
  from experiments import rlpr

  cfg = dataclasses.replace(
    rlpr.Config(),
    **SMOKE,
    workdir=str(tmp_path / "run"),
    cache_dir=shared_cache,
    std_filter_ema_start=1,
    std_filter_start=2,
    std_filter_beta=1e6,  # above every group's std: step 2 drops them all
    refill_rounds=2,
  )
  train = _check_smoke_run(rlpr, tmp_path, rlpr.run(cfg))
  assert train[0]["dynamic/rounds"] == 1  # nothing filtered at step 1
  assert train[1]["dynamic/rounds"] == 2 and train[1]["dynamic/filled"] == 0
  assert train[1]["rlpr/std_threshold"] > 0
  assert train[1]["dynamic/put_back"] == 0.0
  meta, _ = testing.checkpoints(tmp_path / "run")[2]
  assert meta["data"]["inner"]["queued"] == []
  assert set(meta["data"]["inner"]["inner"]) == {"epoch", "index"}
  state = meta["data"]["tracker"]
  # Step 1 closed (its mean std seeded the average); step 2's two rounds
  # of B groups are open (ctx.step counts from 0) until step 3's.
  assert state["step"] == 1 and state["ema"] is not None
  assert state["open"] == 1
  assert len(state["stds"]) == 2 * SMOKE["batch_size"]


def test_rlpr_debiases_with_the_initial_policys_scores(tmp_path):
  """(2) r' is scored once for the whole training set by the policy of
  the run's first step and kept in the workdir: a later policy, and a
  resumed run, reuse those scores; without InitialScores make_batch scores
  r' with the current policy."""
  from experiments import rlpr
  from rlreason.data import sources as data_lib

  sizes = dict(batch_size=2, group_size=2, max_new_tokens=8, max_prompt_len=64)
  ctx = testing.tiny_context(
    rlpr.Config(**sizes, kl_coef=0.0, std_filter=False)
  )
  train = data_lib.load(ctx.cfg.data, "train")[:6]
  examples = train[:2]
  rollout = testing.tiny_rollout(ctx, examples)
  path = str(tmp_path / "rlpr_no_reasoning.json")
  initial = rlpr.InitialScores(path)
  initial.prompts(ctx.cfg, train)  # the loop's prompt_iterator hook
  ctx.step = 0
  first, _ = rlpr.make_batch(rollout, examples, ctx, initial=initial)
  saved = json.load(open(path))
  assert sorted(saved) == sorted(e.uid for e in train)  # all, at step 0
  now, _ = rlpr.make_batch(rollout, examples, ctx)  # the current policy's
  np.testing.assert_allclose(first["adv"], now["adv"], rtol=1e-5, atol=1e-6)
  # A later policy: r' stays the first policy's, in this run and resumed.
  ctx.params = jax.tree.map(lambda x: x * 1.5, ctx.params)
  ctx.step = 3
  for init in (initial, rlpr.InitialScores(path)):
    m = rlpr.make_batch(rollout, examples, ctx, initial=init)[1]
    base = np.asarray(
      [saved[examples[i].uid] for i in rollout.prompt_ids], np.float32
    )
    np.testing.assert_allclose(
      m["reward/ref_prob_no_reasoning"], base.mean(), rtol=1e-5, atol=1e-7
    )
  m_changed = rlpr.make_batch(rollout, examples, ctx)[1]
  assert not np.isclose(
    m_changed["reward/ref_prob_no_reasoning"], base.mean(), rtol=1e-3, atol=0
  )


def _spied_step(module, monkeypatch, **config):
  """(ctx, examples, rollout, seen) for `module`'s make_batch at a tiny
  size: two prompts of the module's data, a rollout of the tiny policy,
  and every `rewards` (total, parts) it passes to outcome_batch appended
  to `seen`."""
  from rlreason.data import sources as data_lib

  sizes = dict(batch_size=2, group_size=2, max_new_tokens=8, max_prompt_len=64)
  cfg = module.Config(**sizes, kl_coef=0.0, **config)
  ctx = testing.tiny_context(cfg)
  examples = data_lib.load(cfg.data, "train")[:2]
  rollout = testing.tiny_rollout(ctx, examples)
  seen = []
  real = module.objective.outcome_batch

  def spy(*args, rewards, **kw):
    seen.append(rewards)
    return real(*args, rewards=rewards, **kw)

  monkeypatch.setattr(module.objective, "outcome_batch", spy)
  return ctx, examples, rollout, seen


def test_rlpr_adds_the_authors_format_and_repetition_terms(monkeypatch):
  """(4) r = 0.9 r_hat + 0.1 fmt, then -1 where the words repeat and the
  reward is not 0."""
  from experiments import rlpr

  ctx, examples, rollout, seen = _spied_step(
    rlpr, monkeypatch, std_filter=False
  )
  cfg = ctx.cfg
  fmt = np.array([1, 0, 1, 0], np.float32)
  rep = np.array([False, False, True, True])
  monkeypatch.setattr(rlpr.format_lib, "format_tags", lambda t, **k: fmt)
  monkeypatch.setattr(rlpr.repetition, "repeats", lambda t, **k: rep)
  ctx.step = 0
  rlpr.make_batch(rollout, examples, ctx)
  ctx.cfg = dataclasses.replace(cfg, format_weight=0.1, repetition_limit=10)
  ctx.cfg.validate()
  _, m = rlpr.make_batch(rollout, examples, ctx)
  r_hat, got = (np.asarray(total) for total, _ in seen)
  want = 0.9 * r_hat + 0.1 * fmt
  want = np.where(rep & (want != 0), want - 1.0, want)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  assert got[2] < 0  # formatted, repeated: 0.9 r_hat + 0.1 - 1
  assert m["reward/format"] == pytest.approx(0.5, rel=1e-6, abs=1e-6)
  with pytest.raises(ValueError, match="--format_weight=2"):
    dataclasses.replace(cfg, format_weight=2.0).validate()


def test_dapo_rewards_correctness_as_plus_or_minus_one(monkeypatch):
  """The paper's +1 / -1 correctness (--signed_reward), the overlong
  penalty added to it; false keeps the run's 0/1."""
  from experiments import dapo

  ctx, examples, rollout, seen = _spied_step(
    dapo, monkeypatch, overlong_buffer=2
  )
  correct = np.array([1, 0, 1, 0], np.float32)
  monkeypatch.setattr(ctx, "score", lambda *a: (correct, {"task": correct}))
  dapo.make_batch(rollout, examples, ctx)
  ctx.cfg = dataclasses.replace(ctx.cfg, signed_reward=False)
  dapo.make_batch(rollout, examples, ctx)
  (signed, parts), (plain, _) = seen
  np.testing.assert_allclose(
    signed - parts["overlong"], [1, -1, 1, -1], rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(
    plain - parts["overlong"], correct, rtol=1e-6, atol=1e-6
  )


def test_laser_de_pays_answered_wrong_rows_past_the_target_not_looping(
  monkeypatch,
):
  """LASER-DE: LASER-D's reward, plus +scale for a wrong response with an
  answer, longer than its target, that does not loop."""
  from experiments import laser

  ctx, examples, rollout, seen = _spied_step(
    laser, monkeypatch, variant="laser_de"
  )
  monkeypatch.setattr(laser.objective, "correctness", lambda *a: np.zeros(4))
  monkeypatch.setattr(
    laser.length,
    "laser_d_adaptive_targets",
    lambda *a, **k: {"easy": 0.0, "medium": 0.0, "hard": 0.0},
  )
  answered = iter(["7", "7", None, "7"])  # row 2 gives no answer
  monkeypatch.setattr(laser.extract, "extract", lambda t: next(answered))
  loops = np.array([False, True, False, False])
  monkeypatch.setattr(laser.repetition, "loops", lambda *a: loops)
  _, metrics = laser.make_batch(rollout, examples, ctx)
  ((total, parts),) = seen
  # Every row is longer than 0 tokens and wrong: rows 0 and 3 earn.
  assert (np.asarray(rollout.lengths) > 0).all()
  np.testing.assert_array_equal(parts["explore"], [0.5, 0, 0, 0.5])
  np.testing.assert_array_equal(parts["laser"], [0, 0, 0, 0])
  np.testing.assert_array_equal(total, [0.5, 0, 0, 0.5])
  assert metrics["laser/looping"] == pytest.approx(0.25, rel=1e-6, abs=1e-6)
  with pytest.raises(ValueError, match="laser, laser_d, laser_de"):
    dataclasses.replace(ctx.cfg, variant="laser_e").validate()


def test_rlpr_authors_unanswered_and_no_reasoning_context(monkeypatch):
  """PAPER's authors' choices: (1) a completion without a final answer
  scores r = 0 (--score_unanswered=false; answered rows keep their score),
  (2) r' scores prompt + " " + y* (--no_reasoning_opener=false) instead of
  prompt + "answer: " + y*."""
  from experiments import rlpr

  ctx, examples, rollout, seen = _spied_step(
    rlpr, monkeypatch, std_filter=False, debias=False
  )
  cfg = ctx.cfg
  rollout = rollout._replace(
    texts=["1 + 2\nanswer: 3", "no final line", "so\nanswer: 7", "x"]
  )
  ctx.step = 0
  rlpr.make_batch(rollout, examples, ctx)
  ctx.cfg = dataclasses.replace(cfg, score_unanswered=False)
  rlpr.make_batch(rollout, examples, ctx)
  fallback, authors = (np.asarray(parts["ref_prob"]) for _, parts in seen)
  assert (fallback > 0).all()
  np.testing.assert_allclose(
    authors, [fallback[0], 0.0, fallback[2], 0.0], rtol=1e-6, atol=1e-7
  )
  prefixes = []

  def score(prompt_ids, pre, refs):
    prefixes.extend(pre)
    return np.zeros(len(refs), np.float32)

  for opener in (True, False):
    ctx.cfg = dataclasses.replace(cfg, no_reasoning_opener=opener)
    rlpr.InitialScores._score(ctx, examples, score)
  assert prefixes == ["answer: ", "answer: ", " ", " "]
  assert not rlpr.PAPER["score_unanswered"]
  assert not rlpr.PAPER["no_reasoning_opener"]


def test_treerl_trains_the_authors_leaf_subset():
  """(3) --train_leaves=K: K leaves a prompt, one correct kept when any;
  only tokens on a trained leaf's path carry advantage, scaled by G / K;
  the same step draws the same subset."""
  from experiments import treerl
  from rlreason.data import sources as data_lib
  from rlreason.rl import tree_credit

  sizes = dict(batch_size=2, group_size=4, max_new_tokens=8, max_prompt_len=64)
  cfg = treerl.Config(**sizes, forks=1, fork_branches=1, train_leaves=2)
  cfg.validate()
  ctx = testing.tiny_context(cfg)
  ctx.generate_fn = treerl.generate_fn(cfg)
  examples = data_lib.load(cfg.data, "train")[:2]
  rollout = testing.tiny_rollout(ctx, examples)
  rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0], np.float32)
  ctx.score = lambda ro, ex: (rewards, {})
  ctx.correct_fn = lambda texts, gold: rewards
  ctx.step = 5
  batch, _ = treerl.make_batch(rollout, examples, ctx)
  again, _ = treerl.make_batch(rollout, examples, ctx)
  np.testing.assert_array_equal(batch["adv"], again["adv"])
  trained = tree_credit.select_leaves(
    rewards,
    rollout.prompt_ids,
    2,
    np.random.default_rng((cfg.seed, 5, 0x7EE)),
  )
  assert trained[[0, 3]].any()  # prompt 0's correct leaves: one kept
  want = 2.0 * tree_credit.tree_advantages(
    rewards,
    rollout.parent,
    rollout.fork_col,
    np.asarray(rollout.mask),
    rollout.prompt_ids,
    path_lengths=np.asarray(rollout.mask_full).sum(-1),
    trained=trained,
  )
  np.testing.assert_allclose(batch["adv"], want, rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match="--train_leaves=5"):
    dataclasses.replace(cfg, train_leaves=5).validate()
  assert treerl.PAPER["train_leaves"] == 16


def test_ettrl_reshapes_by_the_whole_paths_relative_entropy():
  """(2) A * (1 + (mean_g(H) - H_i) / mean_g(H)), H over the leaf's whole
  path: a branch's shared prefix counts with its parent's entropies."""
  from experiments import ettrl

  # One group: root 0 (3 tokens), branch 1 forked from it at column 2,
  # root 2, branch 3 forked from branch 1 at column 3 (a later round).
  rollout = types.SimpleNamespace(
    entropy=np.array(
      [[1.0, 1.0, 4.0, 0], [0, 0, 2.0, 2.0], [0.5, 0.5, 0, 0], [0, 0, 0, 6.0]],
      np.float32,
    ),  # fmt: skip
    parent=np.array([-1, 0, -1, 1]),
    fork_col=np.array([0, 2, 0, 3]),
    level=np.array([0, 1, 0, 2]),
    mask_full=np.array(
      [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32
    ),
  )
  h = ettrl.path_entropy(rollout)
  # Branch 1: [1, 1 | 2, 2]; branch 3: [1, 1, 2 | 6] (its parent's, filled).
  np.testing.assert_allclose(h, [2.0, 1.5, 0.5, 2.5], rtol=1e-6, atol=1e-6)
  adv = np.array([1.0, -1.0, 2.0, 0.5], np.float32)
  got = ettrl.reshape_advantages(adv, h, 4, 1.0)
  mean = 6.5 / 4
  np.testing.assert_allclose(
    got, adv * (1 + (mean - h) / mean), rtol=1e-6, atol=1e-6
  )
  # By hand for row 2: 2 * (1 + (1.625 - 0.5) / 1.625) = 3.3846.
  assert got[2] == pytest.approx(3.384615, rel=1e-5, abs=1e-6)
  # A group of entropy 0 keeps its advantages.
  np.testing.assert_array_equal(
    ettrl.reshape_advantages(adv, np.zeros(4), 4, 1.0), adv
  )


def test_ampo_comprehension_is_the_gold_answers_gain_from_the_reasoning(
  monkeypatch,
):
  """(3) max(p(gold | prompt, candidate's reasoning) - p(gold | prompt), 0),
  the candidate's reasoning cut before its final answer."""
  from experiments import ampo
  from rlreason.data.sources import Example

  calls = []

  def fake(ctx, prompt_ids, prefixes, references):
    calls.append((list(prompt_ids), list(prefixes), list(references)))
    table = {
      "answer: ": 0.25,
      "3+4=7\nanswer: ": 0.75,
      "junk\nanswer: ": 0.125,
    }
    return np.asarray([table[p] for p in prefixes], np.float32)

  monkeypatch.setattr(ampo.self_scoring, "reference_probs", fake)
  ctx = types.SimpleNamespace(
    cfg=ampo.Config(),
    encode_prompts=lambda exs: [[ord(c) for c in e.question] for e in exs],
  )
  examples = [Example("a", "q1", "7"), Example("b", "q2", "7")]
  pairs = [(0, "3+4=7\nanswer: 7"), (0, "junk"), (1, "3+4=7\nanswer: 7")]
  got = ampo.comprehension(ctx, examples, pairs)
  # 0.75 - 0.25; junk has no answer: its text + the opener, below 0.25: 0.
  np.testing.assert_allclose(got, [0.5, 0.0, 0.5], rtol=1e-6, atol=1e-7)
  (ids, prefixes, refs), (base_ids, base_prefixes, _) = calls
  # Up to the final answer's value (its line's opener kept).
  assert prefixes == ["3+4=7\nanswer: ", "junk\nanswer: ", "3+4=7\nanswer: "]
  assert ids == [[ord("q"), ord("1")]] * 2 + [[ord("q"), ord("2")]]
  assert refs == ["7", "7", "7"] and base_prefixes == ["answer: "] * 2
  assert len(base_ids) == 2  # the baseline once per example


def test_dars_shares_extra_rollouts_by_the_authors_table_and_drops_solved():
  """(1) K * G extra rollouts, one at a time, in proportion to the
  authors' ET counts; (2) pooled advantages; prompts whose pooled
  accuracy is 0 or 1 leave the update."""
  from experiments import dars
  from rlreason.data.sources import Example

  cfg = dars.Config(group_size=8, batch_size=4, extra_groups=2, kl_coef=0.0)
  cfg.validate()
  examples = [Example(str(i), "q", "1") for i in range(4)]
  # First round: accuracies 0, 1/8, 1 and 2/8 (ET weights 24, 10, 0, 3).
  first = [0] * 8 + [1] + [0] * 7 + [1] * 8 + [1, 1] + [0] * 6
  # Extra rollouts: prompt 0 stays unsolved, the others all right.
  extra_right = {0: 0, 1: 1, 3: 1}
  drawn = []

  def rollout_of(prompt_ids, right):
    n = len(prompt_ids)
    return types.SimpleNamespace(
      texts=[str(x) for x in right],
      lengths=np.full(n, 2),
      finish_reasons=np.full(n, "eos"),
      prompt_ids=np.asarray(prompt_ids),
    )

  def generate(params, more, key, step, *, group_size, sampling):
    assert group_size == 1  # single rollouts
    drawn.append([e.uid for e in more])
    return rollout_of(
      np.arange(len(more)), [extra_right[int(e.uid)] for e in more]
    )

  def score(ro, exs):
    r = np.asarray([float(t) for t in ro.texts], np.float32)
    return r, {}

  ctx = types.SimpleNamespace(
    cfg=cfg,
    params=None,
    step=0,
    generate=generate,
    score=score,
    correct_fn=lambda t, gold: np.asarray([float(x) for x in t]),
    batch_from_rollout=lambda r: {
      "tokens": np.zeros((len(r.texts), 4), np.int32),
      "positions": np.zeros((len(r.texts), 4), np.int32),
      "mask": np.ones((len(r.texts), 2), np.float32),
    },
    tokenizer=types.SimpleNamespace(pad_id=0),
  )
  batch, m = dars.make_batch(rollout_of(np.repeat(np.arange(4), 8), first),
                             examples, ctx)  # fmt: skip
  # 16 extra rollouts: 16 * (24, 10, 0, 3) / 37 = 10.38, 4.32, 0, 1.30,
  # floors 15, the largest remainder (prompt 0's) takes the 16th.
  assert sorted(drawn[0]) == ["0"] * 11 + ["1"] * 4 + ["3"]
  assert batch["mask"].shape == (48, 2)
  pooled_1 = (1 + 4) / 12  # prompt 1: 1 of 8, then 4 of 4
  uids = [str(i) for i in np.repeat(np.arange(4), 8)] + drawn[0]
  for row, uid in enumerate(uids):
    # Prompt 0 (0 of 19) and prompt 2 (8 of 8) leave the update.
    assert batch["mask"][row].any() == (uid in ("1", "3")), row
  r1 = np.asarray([1] + [0] * 7 + [1] * 4, np.float64)
  want = (r1 - pooled_1) / (r1.std(ddof=1) + cfg.std_eps)
  rows_1 = [i for i, u in enumerate(uids) if u == "1"]
  np.testing.assert_allclose(batch["adv"][rows_1], want, rtol=1e-5, atol=1e-6)
  assert m["dars/kept"] == pytest.approx(
    (8 + 4 + 8 + 1) / 48, rel=1e-6, abs=1e-9
  )


def test_dars_b_smoke(tmp_path):
  from experiments import dars

  # The preset fills the fields left at their defaults; set ones win.
  cfg = dataclasses.replace(
    dars.Config(),
    **SMOKE,
    variant="dars_b",
    extra_groups=2,
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  got = dars.resolve(cfg)
  assert (got.batch_size, got.extra_groups) == (SMOKE["batch_size"], 2)
  assert (got.minibatches, got.ppo_epochs) == (1, 2)  # full batch, 2 epochs
  assert got.lr == dars.DARS_B["lr"] != dars.Config().lr
  paper = dataclasses.replace(dars.Config(), **dars.PAPER, scale="paper")
  big = dars.resolve(dataclasses.replace(paper, variant="dars_b"))
  assert (big.batch_size, big.minibatches, big.ppo_epochs) == (3072, 1, 2)
  big.validate()
  _check_smoke_run(dars, tmp_path, dars.run(cfg))
  saved = json.load(open(tmp_path / "run/config.json"))
  assert (saved["variant"], saved["ppo_epochs"], saved["lr"]) == (
    "dars_b",
    2,
    dars.DARS_B["lr"],
  )


def test_knowrl_prunes_the_hints_of_prompts_that_come_back(tmp_path):
  from experiments import knowrl

  # A pool of one batch: step 2 trains on step 1's prompts again. The
  # warm start barely trains, so a probe without one KP solves as little as
  # the hinted rollouts did, and every prompt's probed KP is dropped.
  cfg = dataclasses.replace(
    knowrl.Config(),
    **SMOKE,
    prompt_pool=SMOKE["batch_size"],
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  train = _check_smoke_run(knowrl, tmp_path, knowrl.run(cfg))
  assert train[0]["knowrl/kps"] >= 1
  assert train[1]["knowrl/kps"] == train[0]["knowrl/kps"] - 1
  with pytest.raises(ValueError, match="--prompt_pool=5 exceeds the 4"):
    knowrl._pool(lambda cfg, examples: examples, 5)(cfg, list(range(4)))


def test_kdrl_tells_the_planner_every_field_its_kd_term_reads():
  from experiments import kdrl

  cfg = kdrl.Config()
  n, t = 3, cfg.max_new_tokens
  batch = {
    k: np.full((n, *shape), 0.5, np.float32)
    for k, shape in kdrl.train_fields(cfg).items()
  }
  batch["mask"] = np.ones((n, t), np.float32)
  logp = np.full((n, t), -1.0, np.float32)
  # A field missing from train_fields raises KeyError here (as it did in
  # the planner's train step).
  per_token, metrics = kdrl.kd_term(logp, None, batch, cfg=cfg)
  assert per_token.shape == (n, t)
  # k2 = (logp - teacher_logp)^2 / 2 = 1.125, weighted by kd_weight 0.5.
  np.testing.assert_allclose(per_token, 0.5625, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(metrics["kd"], 1.125, rtol=1e-6, atol=1e-7)


def test_search_r1_ablation_trains_on_the_retrieved_tokens(tmp_path):
  """mask_observations=False runs end to end: its batch's old log-probs
  (observation tokens included) come from Context.trainer_logp, one
  micro-batch at a time."""
  from experiments import search_r1

  cfg = dataclasses.replace(
    search_r1.Config(),
    **SMOKE,
    mask_observations=False,
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )
  _check_smoke_run(search_r1, tmp_path, search_r1.run(cfg))


def test_grpo_with_scanned_layers_trains_as_unrolled(tmp_path, shared_cache):
  """--scan_layers (the layers as one lax.scan in the full forwards:
  training and scoring): the same samples, rewards and losses as the
  unrolled stack, step by step (step 2 has a reward, a loss and a
  gradient)."""
  grpo = importlib.import_module("experiments.grpo")
  rows = {}
  for scan in (False, True):
    run_dir = tmp_path / f"scan_{scan}"
    cfg = dataclasses.replace(
      grpo.Config(),
      **SMOKE,
      workdir=str(run_dir / "run"),
      cache_dir=shared_cache,
      scan_layers=scan,
    )
    rows[scan] = _check_smoke_run(grpo, run_dir, grpo.run(cfg))
  for unrolled, scanned in zip(rows[False], rows[True], strict=True):
    for key in ("reward", "length", "entropy", "loss", "grad_norm"):
      np.testing.assert_allclose(
        scanned[key], unrolled[key], rtol=1e-4, atol=1e-5, err_msg=key
      )
