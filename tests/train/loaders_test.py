"""The run's model settings (--remat, --remat_policy, --sequence_parallel)
reach the model's config, from a preset and from an HF directory."""

import dataclasses

import jax

from rlreason import config
from rlreason import mesh as mesh_lib
from rlreason import testing
from rlreason.model import hf
from rlreason.model import transformer
from rlreason.train import loaders


def test_the_runs_model_settings_reach_the_model_config(tmp_path):
  mesh = mesh_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  cfg = config.BaseConfig(
    model="tiny",
    remat=True,
    remat_policy="dots",
    sequence_parallel=True,
    mesh_tensor=2,
  )
  want = {"remat": True, "remat_policy": "dots", "sequence_parallel": True}
  model_cfg, _ = loaders.load_model(cfg, mesh)
  assert {k: getattr(model_cfg, k) for k in want} == want
  # An HF directory's own config says nothing of them: the run's win.
  saved = testing.tiny_model_config(qkv_bias=True)
  hf.save(str(tmp_path), saved, transformer.init(saved, jax.random.key(0)))
  model_cfg, _ = loaders.load_model(
    dataclasses.replace(cfg, init_from=str(tmp_path)), mesh
  )
  assert {k: getattr(model_cfg, k) for k in want} == want
  assert model_cfg.d_model == saved.d_model
