"""LoRA runs of the shared loop end to end (tiny model, 2 GRPO steps): only
adapters train, KL to the base starts at 0, the merged export loads in
transformers and the adapters alone load with peft, and a killed run
resumes bit-exactly."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import grpo
from rlreason import testing
from rlreason.eval import trained
from rlreason.model import hf
from rlreason.model import lora
from rlreason.model import transformer
from rlreason.train import adapters as adapters_lib
from rlreason.train import loaders


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("lora")
  cfg = dataclasses.replace(
    grpo.TinyConfig(),
    **{**testing.SMOKE, "eval_size": 2},
    lora_rank=4,
    lora_alpha=8.0,
    kl_coef=0.05,
    lr=1e-2,
    warmup_steps=0,  # TinyConfig's 5 would leave step 1's update at lr 0
    # Digits written, not correctness: the 2-step warm start rarely solves
    # a problem, and a run rewarded 0 throughout leaves B at 0 (but for
    # Adam's normalised rounding noise, which once passed this test).
    reward=testing.register_digits_reward(),
    workdir=str(tmp / "run"),
    cache_dir=str(tmp / "cache"),
  )
  return cfg, grpo.run(cfg)


def _paths(tree):
  return [
    tuple(getattr(k, "key", k) for k in path)
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
  ]


def test_only_adapters_train_and_kl_starts_at_zero(run):
  cfg, out = run
  params = out["state"].params
  paths = _paths(params)
  assert paths and all(p[-1] in ("a", "b") for p in paths)
  kernels = {p[-2] for p in paths}
  assert kernels == set(lora.TARGETS["all"])
  # B started at 0 and was trained.
  assert any(
    float(jnp.abs(leaf["b"]).max()) > 0
    for sub in params.values()
    for g in sub.values()
    for leaf in g.values()
  )
  rows = testing.train_rows(cfg.workdir)
  assert abs(rows[1]["kl"]) < 1e-6  # the adapted policy starts as the base
  # Step 1 moved B: the policy is off the reference (KL ~6e-3 here; the
  # rounding between two programs computing the same policy is ~1e-14).
  assert rows[2]["kl"] > 1e-4


def test_a_run_starts_from_a_lora_runs_merged_policy(run, tmp_path):
  """--init_from=<a LoRA run>: the adapters merged into its base, as the
  evaluation loads them, as a full model (this run's own LoRA, if any,
  goes on top of that)."""
  cfg, out = run
  policy = trained.load(cfg.workdir)
  mesh = jax.tree.leaves(policy.params)[0].sharding.mesh
  second = dataclasses.replace(
    grpo.TinyConfig(), init_from=cfg.workdir, workdir=str(tmp_path / "b")
  )
  model_cfg, params = loaders.load_model(second, mesh)
  assert model_cfg.d_model == policy.model_cfg.d_model
  jax.tree.map(np.testing.assert_array_equal, params, policy.params)
  base = trained.load(policy.run_cfg.init_from).params  # the warm start
  assert not jax.tree.all(jax.tree.map(np.array_equal, params, base))


def test_a_lora_run_starts_from_a_lora_runs_merged_policy(run, tmp_path):
  """A LoRA run with --init_from=<a LoRA run>: its adapters go on top of
  that run's merged policy, which is its reference too (KL 0 at step 1,
  B moved by it); loaded, it is that policy plus its own adapters (at 0
  steps: exactly that policy)."""
  cfg, _ = run
  first = trained.load(cfg.workdir)
  on_top = dataclasses.replace(
    cfg, init_from=cfg.workdir, steps=1, workdir=str(tmp_path / "b")
  )
  out = grpo.run(on_top)
  params = out["state"].params
  assert all(p[-1] in ("a", "b") for p in _paths(params))
  assert any(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(params))
  assert abs(testing.train_rows(on_top.workdir)[1]["kl"]) < 1e-6
  second = trained.load(on_top.workdir)
  # Pinned to the run's last checkpoint.
  pinned = os.path.join(cfg.workdir, "checkpoints", str(cfg.steps))
  assert second.run_cfg.init_from == pinned
  assert not jax.tree.all(
    jax.tree.map(np.array_equal, second.params, first.params)
  )
  unmoved = dataclasses.replace(on_top, steps=0, workdir=str(tmp_path / "c"))
  grpo.run(unmoved)
  jax.tree.map(
    np.testing.assert_array_equal,
    trained.load(unmoved.workdir).params,
    first.params,
  )


def _ours(params, model_cfg, tokens):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return np.asarray(transformer.apply(params, tokens, positions, model_cfg)[0])


def _tokens():
  return jnp.asarray(np.random.default_rng(0).integers(3, 100, (2, 9)))


def test_merged_export_loads_in_transformers(run, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  _, out = run
  policy = trained.load(out["workdir"])
  assert policy.adapters is not None
  # The merged params are base + adapters as the train step forms them.
  adapted, _ = adapters_lib.prepare(
    policy.run_cfg,
    policy.model_cfg,
    trained.loaders.load_model(policy.run_cfg, policy.mesh)[1],
    policy.mesh,
    adapters_lib.lora_config(policy.run_cfg),
  )
  combined = lora.combine(adapted.base, policy.adapters, adapted.lcfg)
  tokens = _tokens()
  ours = _ours(policy.params, policy.model_cfg, tokens)
  np.testing.assert_allclose(
    _ours(combined, policy.model_cfg, tokens), ours, rtol=1e-5, atol=1e-5
  )
  out_dir = trained.export_hf(policy, str(tmp_path / "hf"))
  model = transformers.AutoModelForCausalLM.from_pretrained(out_dir)
  with torch.no_grad():
    theirs = model(torch.tensor(np.asarray(tokens))).logits.numpy()
  np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)


# peft's PeftModel.from_pretrained calls an API transformers deprecated.
@pytest.mark.filterwarnings(
  "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)
def test_adapter_alone_loads_with_peft(run, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  peft = pytest.importorskip("peft")
  _, out = run
  from experiments import evaluate as evaluate_cli

  res = evaluate_cli.run(
    evaluate_cli.Config(
      checkpoint=out["workdir"],
      export_peft=str(tmp_path / "adapter"),
      evaluate=False,
      mesh_fsdp=1,
    )
  )
  policy, out_dir = res["policy"], res["export_peft"]
  with open(os.path.join(out_dir, "adapter_config.json")) as f:
    assert json.load(f)["r"] == 4
  # The run's base: its warm start, an HF directory.
  base_dir = policy.run_cfg.init_from
  base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
  model = peft.PeftModel.from_pretrained(base, out_dir).eval()
  tokens = _tokens()
  with torch.no_grad():
    theirs = model(torch.tensor(np.asarray(tokens))).logits.numpy()
  ours = _ours(policy.params, policy.model_cfg, tokens)
  np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)
  with pytest.raises(trained.CheckpointError, match="not a LoRA run"):
    trained.export_peft(
      dataclasses.replace(policy, adapters=None), str(tmp_path / "x")
    )


@pytest.mark.slow
def test_sigkill_then_rerun_resumes_lora_exactly(tmp_path):
  steps = 3
  cmd = lambda run: testing.experiment_cmd(  # noqa: E731
    "grpo",
    tmp_path / run,
    tmp_path / "cache",
    steps=steps,
    lora_rank=4,
    lora_quantize="nf4",
    keep_checkpoints=steps + 1,
  )
  testing.run_killed_and_resumed(cmd("a"), cmd("b"), tmp_path / "b")
  a, b = testing.train_rows(tmp_path / "a"), testing.train_rows(tmp_path / "b")
  assert sorted(a) == list(range(1, steps + 1)) and a == b
  ca = testing.checkpoints(tmp_path / "a")
  cb = testing.checkpoints(tmp_path / "b")
  jax.tree.map(np.testing.assert_array_equal, ca[steps][1], cb[steps][1])
  assert all(p[-1] in ("a", "b") for p in _paths(ca[steps][1]))


def _one_step_qlora(cfg, quantize: str, tmp_path):
  """`cfg` as a one-step QLoRA smoke run (rank 2) in tmp_path."""
  return dataclasses.replace(
    cfg,
    **{**testing.SMOKE, "steps": 1, "eval_size": 1},
    lora_rank=2,
    lora_quantize=quantize,
    workdir=str(tmp_path / "run"),
    cache_dir=str(tmp_path / "cache"),
  )


def test_a_qlora_run_exports_and_starts_another(tmp_path):
  """A QLoRA run's policy (kernels formed at use over its nf4 base) exports
  as plain Hugging Face weights (this failed with a KeyError before), and
  --init_from=<the run> starts from those same weights."""
  cfg = _one_step_qlora(grpo.TinyConfig(), "nf4", tmp_path)
  grpo.run(cfg)
  policy = trained.load(cfg.workdir)
  assert any(
    lora.formed(x) for x in jax.tree.leaves(policy.params, is_leaf=lora.formed)
  )
  hf_dir = trained.export_hf(policy, str(tmp_path / "hf"))
  _, exported = hf.load(hf_dir)
  formed = lora.formed_once(policy.params)
  jax.tree.map(np.testing.assert_array_equal, exported, formed)
  second = dataclasses.replace(
    cfg, lora_rank=0, lora_quantize="", init_from=cfg.workdir
  )
  _, params = loaders.load_model(second, policy.mesh)
  jax.tree.map(np.testing.assert_array_equal, params, exported)


def test_bad_lora_flags_are_config_errors():
  for fields, match in (
    (dict(lora_quantize="nf4"), "needs --lora_rank > 0"),
    (dict(lora_rank=-1), "--lora_rank=-1"),
    (dict(lora_rank=2, lora_targets="ffn"), "--lora_targets='ffn'"),
  ):
    with pytest.raises(ValueError, match=match):
      dataclasses.replace(grpo.TinyConfig(), **fields).validate()


@pytest.mark.parametrize("name", ["search_r1", "treerl"])
def test_multiturn_and_tree_rollouts_take_a_quantised_base(name, tmp_path):
  """Segment-decoded rollouts (multi-turn, tree) sample the combined tree
  of a QLoRA run where it lies."""
  import importlib

  module = importlib.import_module(f"experiments.{name}")
  cfg = _one_step_qlora(module.Config(), "int8", tmp_path)
  out = module.run(cfg)
  assert out["step"] == 1 and np.isfinite(out["loss"])
