"""T-PPO's windowed batches (experiments/truncated_ppo.py) carry the same
tokens, log-probs and returns as whole responses scored in one forward;
its in-flight responses survive a stop (the checkpointed slots)."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from absl.testing import absltest

from experiments import ppo
from experiments import truncated_ppo
from rlreason.data import difficulty
from rlreason.data import sources as data_lib
from rlreason.model import policy
from rlreason import testing
from rlreason.rl import value

WINDOW, BUDGET = 4, 12


def _setup(**overrides):
  """(cfg, ctx, train examples) of a random tiny policy and critic."""
  fields = dict(
    max_new_tokens=WINDOW,
    max_response_len=BUDGET,
    eval_max_new_tokens=BUDGET,
    batch_size=4,
    group_size=2,
    mesh_fsdp=1,
    whiten_advantages=False,
  )
  cfg = truncated_ppo.Config(**{**fields, **overrides})
  ctx = testing.tiny_context(cfg)
  critic = value.init(
    ctx.model_cfg, jax.random.key(1), policy_params=ctx.params
  )
  # A head that reads the state (the initial one is zero).
  critic["head"]["kernel"] = jax.random.normal(
    jax.random.key(2), critic["head"]["kernel"].shape
  )
  ctx.extra = {value.KEY: critic}
  return cfg, ctx, data_lib.load(cfg.data, "train")


def _step(ctx, examples, slots, step):
  """make_batch on a fresh rollout of the step's prompts."""
  cfg = ctx.cfg
  ctx.step = step
  batch_examples = examples[step * cfg.batch_size :][: cfg.batch_size]
  rollout = testing.tiny_rollout(ctx, batch_examples, step)
  return truncated_ppo.make_batch(rollout, batch_examples, ctx, slots=slots)


class WindowedBatchTest(absltest.TestCase):
  def test_the_continuation_call_samples_as_the_runs_sampler(self):
    """A response's next window is sampled with the run's sampler flags
    (Context.rollout_model_cfg: --rollout_tensor, --rollout_layout,
    --rollout_dtype; --rollout_rows), in static calls, the program the
    planner plans (plan_config)."""
    cfg, ctx, examples = _setup(rollout_rows=3, rollout_layout="replicated")
    slots = truncated_ppo.Slots(cfg.num_sequences)
    prompt = cfg.max_prompt_len + cfg.max_response_len  # the continuation's
    with absltest.mock.patch.object(
      truncated_ppo.rollout_lib,
      "generate",
      wraps=truncated_ppo.rollout_lib.generate,
    ) as spy:
      for step in range(2):
        _step(ctx, examples, slots, step)
    calls = [c.kwargs for c in spy.call_args_list]
    cont = [k for k in calls if k["max_prompt_len"] == prompt]
    assert cont, calls
    for k in cont:
      assert k["model_cfg"] == ctx.rollout_model_cfg
      assert k["model_cfg"].rollout_layout == "replicated"
      assert (k["rows_per_call"], k["batching"]) == (3, "static")
      assert k["mesh"] is ctx.mesh

  def test_windows_add_up_to_whole_responses(self):
    cfg, ctx, examples = _setup()
    params, model_cfg = ctx.params, ctx.model_cfg
    slots = truncated_ppo.Slots(cfg.num_sequences)
    pending = {}  # slot -> (example, window tokens, window log-probs)
    finished = longest = 0
    for step in range(2 * BUDGET // WINDOW):
      batch, metrics = _step(ctx, examples, slots, step)
      n, s = batch["tokens"].shape
      p = s - WINDOW
      assert batch["mask"].shape == (n, WINDOW)
      # Every window is a slot's next tokens; a full response scored in one
      # forward gives the log-probs the windows were sampled with.
      full_logp = np.asarray(
        policy.completion_logprobs(
          params, batch["tokens"], batch["positions"], model_cfg, 1
        )
      )  # [N, S - 1]: column c scores token c + 1
      np.testing.assert_allclose(
        batch["old_logp"] * batch["mask"],
        full_logp[:, p - 1 :] * batch["mask"],
        rtol=1e-5,
        atol=2e-5,
      )
      # (2) Extended GAE with gamma = lambda = 1: A_t = V(cut) - V(s_t) in
      # flight, R - V(s_t) once ended (column c = V after token c).
      values = np.asarray(
        value.completion_values(
          ctx.extra[value.KEY],
          batch["tokens"],
          batch["positions"],
          model_cfg,
          1,
          with_next=True,
        )
      )
      for i in range(n):
        vmask = batch["value_mask"][i] > 0
        length = int(batch["mask"][i].sum())
        if vmask.any():  # ended: its outcome (the critic's return)
          target = batch["value_returns"][i][vmask][-1]
        else:  # in flight: bootstraps the value at the cut
          target = values[i, p - 1 + length]
        np.testing.assert_allclose(
          batch["adv"][i, :length],
          target - values[i, p - 1 : p - 1 + length],
          rtol=1e-5,
          atol=1e-5,
        )
      for i in range(n):
        window = batch["tokens"][i, p:][batch["mask"][i] > 0].tolist()
        logp = batch["old_logp"][i][batch["mask"][i] > 0].tolist()
        if i not in pending:
          pending[i] = ([], [])
        pending[i][0].extend(window)
        pending[i][1].extend(logp)
        vmask = batch["value_mask"][i] > 0
        if not vmask.any():  # still in flight: no critic target yet
          assert slots.example[i] is not None
          assert len(pending[i][0]) < BUDGET
          continue
        # Ended: the critic learns from exactly the whole response's tokens,
        # each scored as in the windows, with the outcome as its return.
        tokens, logps = pending.pop(i)
        finished += 1
        longest = max(longest, len(tokens))
        assert slots.example[i] is None
        np.testing.assert_array_equal(batch["tokens"][i, 1:][vmask], tokens)
        np.testing.assert_allclose(
          full_logp[i][vmask], logps, rtol=1e-5, atol=2e-5
        )
        positions = batch["positions"][i, 1:][vmask]
        np.testing.assert_array_equal(np.diff(positions), 1)
        start = np.flatnonzero(vmask)[0] + 1
        assert batch["positions"][i, start - 1] == positions[0] - 1
        assert len(tokens) <= BUDGET
        ended_by_length = len(tokens) == BUDGET
        assert ended_by_length or tokens[-1] == ctx.tokenizer.eos_id
        returns = batch["value_returns"][i][vmask]
        reward = returns[-1]
        # gamma = 1
        np.testing.assert_allclose(returns, reward, rtol=1e-6, atol=1e-6)
      assert 0 <= metrics["tppo/in_flight"] <= 1
      ended = batch["value_mask"].any(-1)
      np.testing.assert_allclose(
        metrics["tppo/outcome_tokens"],
        batch["mask"][ended].sum() / batch["mask"].sum(),
        rtol=1e-6,
        atol=1e-7,
      )
    assert finished >= cfg.num_sequences  # every first-round slot ended
    assert longest > 2 * WINDOW  # responses spanned 3 windows

  def test_one_window_of_the_whole_budget_is_ppo(self):
    """Nothing cut (--max_new_tokens = --max_response_len): every response
    ends in its window, and T-PPO's batch is PPO's on the same rollout: the
    same advantages, and the critic learns the same returns against the
    same rollout-time values (experiments/README.md: trained so, it
    learns as PPO does)."""
    cfg, ctx, examples = _setup(max_new_tokens=BUDGET)
    slots = truncated_ppo.Slots(cfg.num_sequences)
    ctx.step = 0
    rollout = testing.tiny_rollout(ctx, examples[: cfg.batch_size], 0)
    got, metrics = truncated_ppo.make_batch(
      rollout, examples[: cfg.batch_size], ctx, slots=slots
    )
    want, _ = ppo.make_batch(rollout, examples[: cfg.batch_size], ctx)
    assert metrics["tppo/ended"] == 1.0
    np.testing.assert_array_equal(got["tokens"], want["tokens"])
    np.testing.assert_array_equal(got["mask"], want["mask"])
    np.testing.assert_allclose(got["adv"], want["adv"], rtol=1e-5, atol=1e-6)
    assert np.abs(want["adv"]).sum() > 0
    p = rollout.prompt_len  # column c of the critic's fields: token c + 1
    completion = slice(p - 1, p - 1 + BUDGET)
    vmask = got["value_mask"][:, completion]
    np.testing.assert_array_equal(vmask, want["mask"])
    for field, ppo_field in (("value_returns", "returns"),
                             ("value_old", "old_values")):  # fmt: skip
      np.testing.assert_allclose(
        got[field][:, completion] * vmask,
        want[ppo_field] * want["mask"],
        rtol=1e-5,
        atol=1e-6,
      )

  def test_micro_batches_sum_to_the_whole_minibatchs_loss(self):
    """The critic's tokens are normalised by the whole minibatch's count of
    value_mask tokens (train_step's norm["value_mask_tokens"]), so two
    micro-batches holding 1 and 6 of its rows' critic tokens give the one
    micro-batch's loss and gradient."""
    import functools

    import optax

    from rlreason.train import train_step as ts

    cfg, ctx, examples = _setup(max_new_tokens=BUDGET)
    batch, _ = _step(ctx, examples, truncated_ppo.Slots(cfg.num_sequences), 0)
    batch = {k: v for k, v in batch.items() if np.ndim(v) >= 1}
    vmask = np.array(batch["value_mask"])
    assert vmask.any(-1).all()  # every response ended in its window
    # Uneven halves: row 0 keeps one critic token, rows 2-3 all theirs.
    keep = np.flatnonzero(vmask[0])[:1]
    vmask[0] = 0
    vmask[0, keep] = 1
    vmask[1] = 0
    batch["value_mask"] = vmask
    params = {**ctx.params, value.KEY: ctx.extra[value.KEY]}
    fn = functools.partial(
      truncated_ppo.loss_fn, cfg=cfg, model_cfg=ctx.model_cfg
    )
    out = []
    for micro in (1, 2):
      step = ts.make_train_step(
        fn, optax.sgd(1.0), micro_batches=micro, donate=False
      )
      state = ts.TrainState(params, optax.sgd(1.0).init(params), 0)
      new, metrics = step(state, batch)
      out.append((new.params[value.KEY], metrics))
    (one, m1), (two, m2) = out
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5, atol=1e-6)
    assert float(m1["value_loss"]) > 0
    # The critic's gradients (SGD at lr 1: the update is -grad).
    old = jax.tree.leaves(params[value.KEY])
    for p0, a, b in zip(old, jax.tree.leaves(one), jax.tree.leaves(two)):
      np.testing.assert_allclose(a - p0, b - p0, rtol=1e-3, atol=1e-5)

  def test_critic_warmup_validation(self):
    truncated_ppo.Config(steps=0).validate()  # no RL steps: nothing to warm
    truncated_ppo.Config(steps=5, critic_warmup=4).validate()
    for bad in (-1, 5):
      with self.assertRaisesRegex(ValueError, "--critic_warmup"):
        truncated_ppo.Config(steps=5, critic_warmup=bad).validate()

  def test_critic_warmup_zeroes_the_policy_advantages(self):
    _, ctx, examples = _setup(critic_warmup=1)
    slots = truncated_ppo.Slots(ctx.cfg.num_sequences)
    batch, _ = _step(ctx, examples, slots, 0)
    assert not batch["adv"].any()
    batch, _ = _step(ctx, examples, slots, 1)
    assert np.abs(batch["adv"]).sum() > 0


def test_slots_state_round_trips_through_json():
  cfg = truncated_ppo.Config(batch_size=2, group_size=2)
  examples = data_lib.load(cfg.data, "train")[:3]
  prompts = difficulty.tracked_iterator(truncated_ppo.Slots(4))(cfg, examples)
  next(prompts)
  slots = prompts.tracker
  slots.calls = 3
  hinted = dataclasses.replace(examples[0], knowledge=("a", "b"), hint="h")
  slots.example[1], slots.example[3] = examples[2], hinted
  slots.context[1], slots.done[1] = [5, 6, 2**31 - 1], [7]
  slots.context[3], slots.done[3] = [8], [9, 10, 0]
  state = json.loads(json.dumps(prompts.state()))
  again = difficulty.tracked_iterator(truncated_ppo.Slots(4))(cfg, examples)
  again.restore(state)
  for field in ("n", "calls", "example", "context", "done"):
    assert getattr(again.tracker, field) == getattr(slots, field), field
  assert again.inner.state() == prompts.inner.state()
  # A checkpoint from before the slots were kept: the iterator's position,
  # the slots free.
  old = difficulty.tracked_iterator(truncated_ppo.Slots(4))(cfg, examples)
  old.restore(prompts.inner.state())
  assert old.inner.state() == prompts.inner.state()
  assert old.tracker.example == [None] * 4
  with pytest.raises(ValueError, match="holds 4 T-PPO slots, the run 2"):
    truncated_ppo.Slots(2).restore(state["tracker"])


def test_a_resumed_run_continues_its_unfinished_responses(tmp_path):
  """The slots ride in the checkpoint (Slots.state): 2 steps, then
  a rerun to 4, train as 4 steps in one go, though responses were in
  flight at the stop (the smoke budget of 3 windows)."""
  cfg = dataclasses.replace(
    truncated_ppo.Config(), **testing.SMOKE, cache_dir=str(tmp_path / "c")
  )
  whole = dataclasses.replace(cfg, steps=4, workdir=str(tmp_path / "a"))
  truncated_ppo.run(whole)
  first = dataclasses.replace(cfg, steps=2, workdir=str(tmp_path / "b"))
  truncated_ppo.run(first)
  meta, _ = testing.checkpoints(first.workdir)[2]
  slots = meta["data"]["tracker"]
  busy = [i for i, e in enumerate(slots["example"]) if e is not None]
  assert busy and all(slots["done"][i] for i in busy), slots["example"]
  truncated_ppo.run(dataclasses.replace(first, steps=4))
  a, b = testing.train_rows(whole.workdir), testing.train_rows(first.workdir)
  assert sorted(a) == [1, 2, 3, 4] and a == b
  jax.tree.map(
    np.testing.assert_array_equal,
    testing.checkpoints(whole.workdir)[4][1],
    testing.checkpoints(first.workdir)[4][1],
  )


if __name__ == "__main__":
  absltest.main()
