"""Every whole-rollout forward of make_batch functions runs with the
activations split by batch on the run's mesh (mesh.activation_mesh), as
the train step and the planner's ref_logp program do: without it, XLA lays
the activations out after the parameters (issue 23's first finding)."""

import dataclasses

import numpy as np

from experiments import kdrl
from experiments import lp_reg
from experiments import rent
from experiments import rlpr
from experiments import siren
from rlreason import mesh as mesh_lib
from rlreason import testing
from rlreason.data import sources as data_lib
from rlreason.eval import teacher as teacher_lib
from rlreason.model import policy


def test_make_batch_forwards_run_on_the_runs_mesh(monkeypatch):
  seen = []
  forward = policy.completion_logprobs_by_rows

  def spy(*args, **kwargs):
    seen.append(mesh_lib.active_mesh())
    return forward(*args, **kwargs)

  monkeypatch.setattr(policy, "completion_logprobs_by_rows", spy)
  calls = {}
  for module in (rent, rlpr, lp_reg, siren, kdrl):
    cfg = module.Config(
      batch_size=4,
      group_size=2,
      max_new_tokens=8,
      max_prompt_len=64,
      warm_start_steps=0,
    )
    ctx = testing.tiny_context(cfg)
    ctx.ref_params = ctx.params  # the KL presets' reference
    assert ctx.mesh is not None
    examples = data_lib.load(cfg.data, "train")[:4]
    rollout = testing.tiny_rollout(ctx, examples)
    before = len(seen)
    if module is siren:  # its anchor, the first batch's nucleus statistic
      nucleus = siren.entropy_reg.nucleus_entropy_fn(cfg.siren_top_p)
      (h,) = ctx.per_token(rollout, (nucleus,))
      assert h.shape == rollout.mask.shape
    else:
      make_batch = getattr(module, "make_batch", None)
      if module is kdrl:  # its teacher's forward
        make_batch = kdrl.make_batch_fn(teacher_lib.Teacher("tiny"))
      batch, _ = make_batch(rollout, examples, ctx)
      assert np.isfinite(batch["adv"]).all(), module.__name__
    calls[module.__name__] = len(seen) - before
    assert seen[before:] and all(m is ctx.mesh for m in seen[before:]), (
      module.__name__
    )
  assert all(calls.values()), calls  # each scored the rollout


def test_whole_rollout_forwards_compile_under_the_score_budget(monkeypatch):
  """--score_temp_budget_mib (libtpu's bound on temporaries, planned for
  the ref_logp / values / teacher / reward_model programs) reaches the
  compile of every whole-rollout forward: the loop's reference log-probs
  (a teacher scores through the same ctx.completion_scores), ppo's
  critic values, rm_grpo's reward model and rlpr's reference-answer
  log-probs. On CPU the flag gives no options
  (train_step.compiler_options), so here it gives one XLA:CPU does not
  know, which fails each of those compiles by name; a known option at
  its default gives the same numbers."""
  import jax
  import jax.numpy as jnp
  import pytest

  from experiments import ppo
  from experiments import rm_grpo
  from rlreason.rewards import model as rm
  from rlreason.rl import value
  from rlreason.train import context as context_lib

  options = {
    777: {"not_an_xla_option": 1},
    778: {"xla_cpu_enable_fast_math": False},
  }
  real = context_lib.ts.compiler_options
  monkeypatch.setattr(
    context_lib.ts,
    "compiler_options",
    lambda mib, mesh: options.get(mib) or real(mib, mesh),
  )
  sizes = dict(batch_size=4, group_size=2, max_new_tokens=8, max_prompt_len=64)
  runs = {}
  for module in (rm_grpo, ppo, rlpr):
    # No KL but rm_grpo's: ppo's and rlpr's forwards are their own.
    kl = {} if module is rm_grpo else {"kl_coef": 0.0, "kl_reward_coef": 0.0}
    ctx = testing.tiny_context(module.Config(**sizes, **kl))
    assert ctx.cfg.needs_ref == (module is rm_grpo)
    ctx.ref_params = ctx.params if ctx.cfg.needs_ref else None
    examples = data_lib.load(ctx.cfg.data, "train")[:4]
    runs[module] = (ctx, examples, testing.tiny_rollout(ctx, examples))
  ctx, examples, rollout = runs[ppo]
  ctx.extra = {value.KEY: value.init(ctx.model_cfg, jax.random.key(1))}
  ctx, examples, rollout = runs[rm_grpo]
  rm_params = rm.init(ctx.model_cfg, jax.random.key(2))
  rm_params["head"]["w"] = jnp.ones_like(rm_params["head"]["w"])
  reward = rm_grpo.scalar_reward(
    rm_params, {"score_mean": 0.0, "score_std": 1.0}, ctx.model_cfg
  )
  forwards = {  # name: (its run, the forward's numbers)
    "ref_logp": (rm_grpo, lambda c, e, r: c.ref_logp(r)),
    "reward_model": (rm_grpo, lambda c, e, r: reward(r, e, c)),
    "values": (ppo, lambda c, e, r: ppo.make_batch(r, e, c)[0]["old_values"]),
    "rlpr": (rlpr, lambda c, e, r: rlpr.make_batch(r, e, c)[0]["adv"]),
  }
  want = {name: f(*runs[m]) for name, (m, f) in forwards.items()}
  for name, (module, f) in forwards.items():
    ctx = runs[module][0]
    cfg = ctx.cfg
    ctx.cfg = dataclasses.replace(cfg, score_temp_budget_mib=777)
    with pytest.raises(jax.errors.JaxRuntimeError, match="not_an_xla_option"):
      f(*runs[module])
    ctx.cfg = dataclasses.replace(cfg, score_temp_budget_mib=778)
    got = f(*runs[module])
    np.testing.assert_allclose(got, want[name], rtol=1e-6, atol=1e-6)
    ctx.cfg = cfg
