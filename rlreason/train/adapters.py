"""LoRA runs of the shared loop: the frozen base, the adapters, the loss.

  adapted, adapters = adapters.prepare(cfg, model_cfg, params, mesh)
  loss = adapted.loss(loss_fn, extra_keys)  # (p, batch, norm, base)
  policy = adapted.policy(adapters)         # merged params, for rollouts

With --lora_rank > 0 (model/lora.py) the optimizer state covers the
adapters only; the base stays on the mesh in the compute dtype (or
quantised: --lora_quantize) and enters every train step as a frozen
argument, never donated or updated. Rollouts and evaluations merge base
and adapters once per step (one plain params tree, so the sampler runs
unchanged), except over a quantised base, where they sample the combined
tree as the train step uses it: each weight dequantised and adapted at use,
one layer at a time (experiments/bench/lora.py times the two).
"""

import dataclasses
import functools
from typing import Any

import jax

from rlreason import mesh as mesh_lib
from rlreason.model import lora
from rlreason.model import transformer


def lora_config(cfg) -> lora.LoraConfig | None:
  """The run's LoraConfig, or None for full fine-tuning (rank 0)."""
  rank = getattr(cfg, "lora_rank", 0)
  if not rank:
    return None
  return lora.LoraConfig(
    rank=rank,
    alpha=cfg.lora_alpha,
    targets=cfg.lora_targets,
    quantize=cfg.lora_quantize,
  )


@dataclasses.dataclass
class Adapted:
  """A LoRA run's frozen half.

  Attributes:
    lcfg: the LoraConfig.
    base: the frozen params on the mesh (TRAIN_RULES), compute dtype or
      quantised; also the KL reference.
    base_axes: their logical axes.
    axes: the adapters' logical axes.
  """

  lcfg: lora.LoraConfig
  base: Any
  base_axes: Any
  axes: Any

  def loss(self, loss_fn, extra_keys=()):
    return adapted_loss(loss_fn, self.lcfg, extra_keys)

  def policy(self, adapters):
    """The params rollouts and evaluations use: base + adapters merged into
    one plain copy, or, over a quantised base (whose point is memory: a
    merged 7B copy alone fills a 16 GiB chip), the combined tree, whose
    weights the model dequantises and adapts at use."""
    if self.lcfg.quantize:
      return lora.combine(self.base, adapters, self.lcfg)
    return _merge(self.base, adapters, self.lcfg)


def adapted_loss(loss_fn, lcfg: lora.LoraConfig, extra_keys=()):
  """loss_fn(params, batch, norm) -> the train step's
  fn(trained, batch, norm, base): the adapters in `trained` joined to the
  frozen base (extra params, e.g. a critic, passed through)."""

  def fn(trained, batch, norm, base):
    own = {k: v for k, v in trained.items() if k not in extra_keys}
    extra = {k: trained[k] for k in extra_keys}
    return loss_fn({**lora.combine(base, own, lcfg), **extra}, batch, norm)

  return fn


@functools.partial(jax.jit, static_argnums=2)
def _merge(base, adapters, lcfg):
  return lora.merge(base, adapters, lcfg)


def prepare(cfg, model_cfg, params, mesh, lcfg: lora.LoraConfig):
  """(Adapted, adapters): the frozen base from `params` and fresh adapters
  (B = 0, so the adapted policy starts as the base)."""
  base = transformer.compute_params(params, model_cfg)
  base = lora.quantize(base, lcfg)
  param_axes = transformer.param_axes(model_cfg)
  base_axes = lora.quantized_axes(param_axes, base)
  base = jax.device_put(
    base,
    mesh_lib.shardings(mesh, base_axes, mesh_lib.TRAIN_RULES, base),
  )
  adapters = lora.init(params, lcfg, jax.random.key(cfg.seed))
  axes = lora.axes(param_axes, adapters)
  adapters = jax.device_put(
    adapters, mesh_lib.shardings(mesh, axes, mesh_lib.TRAIN_RULES, adapters)
  )
  return Adapted(lcfg, base, base_axes, axes), adapters
