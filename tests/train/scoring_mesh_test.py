"""Every whole-rollout forward of make_batch functions runs with the
activations split by batch on the run's mesh (mesh.activation_mesh), as
the train step and the planner's ref_logp program do: without it, XLA lays
the activations out after the parameters (issue 23's first finding)."""

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
