"""Our parameter tree <-> Hugging Face tensor names and layouts.

`hf_names(model_cfg)` maps each of our param paths to its HF tensor name and
a layout kind; `hf_shape`, `read_block` and `to_hf` convert between the two
layouts (hf.py reads and writes the safetensors files with them).

HF stores linear weights as [out, in]; ours are [in, out] with the head axis
split out, so attention kernels are [D, H, Dh] (q/k/v) and [H, Dh, D] (o).
"""

import numpy as np

from rlreason.model import lora
from rlreason.model.transformer import ModelConfig

# kind: how our layout derives from the HF tensor.
#   same        identical
#   T           ours = hf.T                        ([in, out] vs [out, in])
#   heads_in    hf [X*Dh, D] -> ours [D, X, Dh]    (q/k/v kernels)
#   heads_out   hf [D, H*Dh] -> ours [H, Dh, D]    (o kernel)
#   heads_bias  hf [X*Dh]    -> ours [X, Dh]


def hf_names(model_cfg: ModelConfig) -> dict[tuple[str, ...], tuple[str, str]]:
  """Our param path -> (HF tensor name, layout kind)."""
  names = {
    ("embedding",): ("model.embed_tokens.weight", "same"),
    ("final_norm", "scale"): ("model.norm.weight", "same"),
  }
  if not model_cfg.tie_embeddings:
    names[("lm_head",)] = ("lm_head.weight", "T")
  for i in range(model_cfg.n_layers):
    ours, hf = f"layer_{i}", f"model.layers.{i}"
    names[(ours, "input_norm", "scale")] = (
      f"{hf}.input_layernorm.weight",
      "same",
    )
    names[(ours, "post_attn_norm", "scale")] = (
      f"{hf}.post_attention_layernorm.weight",
      "same",
    )
    for p in ("q", "k", "v"):
      names[(ours, "attn", f"{p}_kernel")] = (
        f"{hf}.self_attn.{p}_proj.weight",
        "heads_in",
      )
      if model_cfg.qkv_bias:
        names[(ours, "attn", f"{p}_bias")] = (
          f"{hf}.self_attn.{p}_proj.bias",
          "heads_bias",
        )
    names[(ours, "attn", "o_kernel")] = (
      f"{hf}.self_attn.o_proj.weight",
      "heads_out",
    )
    if model_cfg.o_bias:
      names[(ours, "attn", "o_bias")] = (f"{hf}.self_attn.o_proj.bias", "same")
    if model_cfg.qk_norm:
      for p in ("q", "k"):
        names[(ours, "attn", f"{p}_norm", "scale")] = (
          f"{hf}.self_attn.{p}_norm.weight",
          "same",
        )
    for p in ("gate", "up", "down"):
      names[(ours, "mlp", f"{p}_kernel")] = (f"{hf}.mlp.{p}_proj.weight", "T")
  return names


def hf_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
  """The HF tensor shape of a parameter whose shape is `shape`."""
  if kind == "same":
    return tuple(shape)
  if kind == "T":
    return (shape[1], shape[0])
  if kind == "heads_in":
    return (shape[1] * shape[2], shape[0])
  if kind == "heads_out":
    return (shape[2], shape[0] * shape[1])
  if kind == "heads_bias":
    return (shape[0] * shape[1],)
  raise ValueError(kind)


def read_block(sl, kind: str, index: tuple, shape: tuple) -> np.ndarray:
  """Reads the block `index` (in our layout) from a lazy HF tensor slice."""
  idx = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))
  if kind == "same":
    return sl[idx] if idx else sl[:]
  if kind == "T":
    return sl[idx[1], idx[0]].T
  if kind == "heads_in":
    d_s, x_s, dh_s = idx
    dh = shape[2]
    block = sl[x_s.start * dh : x_s.stop * dh, d_s]  # [x*Dh, d]
    x = x_s.stop - x_s.start
    return block.reshape(x, dh, -1).transpose(2, 0, 1)[:, :, dh_s]
  if kind == "heads_out":
    h_s, dh_s, d_s = idx
    dh = shape[1]
    block = sl[d_s, h_s.start * dh : h_s.stop * dh]  # [d, h*Dh]
    h = h_s.stop - h_s.start
    return block.reshape(-1, h, dh).transpose(1, 2, 0)[:, dh_s, :]
  if kind == "heads_bias":
    x_s, dh_s = idx
    dh = shape[1]
    block = sl[x_s.start * dh : x_s.stop * dh]
    return block.reshape(x_s.stop - x_s.start, dh)[:, dh_s]
  raise ValueError(kind)


def to_hf(x: np.ndarray, kind: str) -> np.ndarray:
  """A parameter in our layout -> the HF tensor."""
  if kind == "same":
    return x
  if kind == "T":
    return x.T
  if kind == "heads_in":
    return x.transpose(1, 2, 0).reshape(x.shape[1] * x.shape[2], x.shape[0])
  if kind == "heads_out":
    return x.transpose(2, 0, 1).reshape(x.shape[2], x.shape[0] * x.shape[1])
  if kind == "heads_bias":
    return x.reshape(-1)
  raise ValueError(kind)


def peft_files(adapters: dict, model_cfg, lcfg: lora.LoraConfig, base=""):
  """(adapter_config.json dict, {tensor name: array}) in PEFT's LoRA format
  for the HF Qwen2 / Llama module names (peft.PeftModel.from_pretrained
  loads them onto the base): lora_A [r, in], lora_B [out, r], unscaled
  (PEFT scales by lora_alpha / r, as here)."""
  names = hf_names(model_cfg)
  tensors = {}
  for layer, sub in adapters.items():
    for group, leaves in sub.items():
      for name, ab in leaves.items():
        module = names[(layer, group, name)][0].removesuffix(".weight")
        a = np.asarray(ab["a"], np.float32)
        b = np.asarray(ab["b"], np.float32)
        r = a.shape[-1]
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = np.ascontiguousarray(
          a.reshape(-1, r).T
        )
        tensors[f"{key}.lora_B.weight"] = np.ascontiguousarray(
          b.reshape(r, -1).T
        )
  config = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": base,
    "r": lcfg.rank,
    "lora_alpha": lcfg.alpha,
    "lora_dropout": 0.0,
    "bias": "none",
    "fan_in_fan_out": False,
    "use_rslora": False,
    "target_modules": sorted(
      lora.HF_MODULES[n] for n in lora.TARGETS[lcfg.targets]
    ),
    "inference_mode": True,
  }
  return config, tensors
