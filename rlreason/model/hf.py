"""Hugging Face checkpoints (config.json + safetensors) <-> ModelConfig, params.

  model_cfg, params = hf.load("/path/to/Qwen2.5-Math-1.5B", mesh=mesh)
  hf.save("/path/out", model_cfg, params)  # loads in transformers

`load` reads each tensor lazily from the safetensors files and builds every
parameter shard directly on its device (`jax.make_array_from_callback`), so a
sharded model never exists as a full replicated copy on one host or device;
`save` gathers one tensor at a time and writes shard by shard.

Which HF tensor holds each parameter, and how its layout differs from ours
([out, in] vs [in, out], heads split out), is in hf_layout.py.
"""

import json
import os
from typing import Any

import jax
import numpy as np
import safetensors
import safetensors.numpy
from absl import logging

from rlreason import mesh as mesh_lib
from rlreason import metrics as metrics_lib
from rlreason.model import hf_layout
from rlreason.model import lora
from rlreason.model import transformer
from rlreason.model.transformer import ModelConfig

_FAMILIES = {
  "LlamaForCausalLM": "llama",
  "Qwen2ForCausalLM": "qwen2",
  "Qwen3ForCausalLM": "qwen3",
}
_ARCH = {family: arch for arch, family in _FAMILIES.items()}
# Loading or writing a large checkpoint (minutes for 32B) prints a line at
# most this often: tensors done, ETA.
PROGRESS_SECONDS = 30.0


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be loaded; the message says why."""


# --- config.json <-> ModelConfig ----------------------------------------------


def config_from_hf(
  hf_cfg: dict,
  *,
  source: str = "config.json",
  dtype: str = "float32",
  compute_dtype: str | None = None,
) -> ModelConfig:
  """ModelConfig from a transformers config dict."""
  archs = hf_cfg.get("architectures") or []
  arch = archs[0] if archs else None
  family = _FAMILIES.get(arch) if arch else hf_cfg.get("model_type")
  if family not in _ARCH:
    raise CheckpointError(
      f"{source}: unsupported architecture "
      f"{arch or hf_cfg.get('model_type')!r}"
      f"; supported: {', '.join(sorted(_FAMILIES))}"
    )
  if hf_cfg.get("mlp_bias"):
    raise CheckpointError(f"{source}: mlp_bias=true is not supported")
  if hf_cfg.get("use_sliding_window"):
    raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
  hidden_act = hf_cfg.get("hidden_act", "silu")
  if hidden_act != "silu":
    raise CheckpointError(f"{source}: hidden_act={hidden_act!r}; only silu")
  try:
    d = hf_cfg["hidden_size"]
    n_heads = hf_cfg["num_attention_heads"]
    # transformers >= 5 writes `rope_parameters` (with rope_theta inside);
    # older versions write `rope_theta` + `rope_scaling`.
    rope = hf_cfg.get("rope_parameters") or hf_cfg.get("rope_scaling") or {}
    rope_theta = float(
      rope.get("rope_theta") or hf_cfg.get("rope_theta", 10_000.0)
    )
    rope_scaling = _rope_scaling_from_hf(rope, source)
    attention_bias = bool(hf_cfg.get("attention_bias", False))
    return ModelConfig(
      vocab_size=hf_cfg["vocab_size"],
      d_model=d,
      n_layers=hf_cfg["num_hidden_layers"],
      n_heads=n_heads,
      n_kv_heads=hf_cfg.get("num_key_value_heads") or n_heads,
      head_dim=hf_cfg.get("head_dim") or d // n_heads,
      mlp_dim=hf_cfg["intermediate_size"],
      rope_theta=rope_theta,
      rope_scaling=rope_scaling,
      rms_eps=float(hf_cfg.get("rms_norm_eps", 1e-6)),
      qkv_bias=True if family == "qwen2" else attention_bias,
      o_bias=False if family == "qwen2" else attention_bias,
      qk_norm=family == "qwen3",
      tie_embeddings=bool(hf_cfg.get("tie_word_embeddings", False)),
      dtype=compute_dtype or dtype,
      param_dtype=dtype,
      max_position=int(hf_cfg.get("max_position_embeddings", 4096)),
      family=family,
    )
  except KeyError as e:
    raise CheckpointError(f"{source}: missing field {e.args[0]!r}") from None


def _rope_scaling_from_hf(rs: dict | None, source: str):
  if not rs:
    return None
  kind = rs.get("rope_type", rs.get("type"))
  if kind in ("default", None):
    return None
  if kind != "llama3":
    raise CheckpointError(
      f"{source}: rope_scaling type {kind!r} is not supported (only llama3)"
    )
  return (
    float(rs["factor"]),
    float(rs["low_freq_factor"]),
    float(rs["high_freq_factor"]),
    int(rs["original_max_position_embeddings"]),
  )


def config_to_hf(model_cfg: ModelConfig) -> dict:
  """transformers config dict for `model_cfg`."""
  c = model_cfg
  out = {
    "architectures": [_ARCH[c.family]],
    "model_type": c.family,
    "vocab_size": c.vocab_size,
    "hidden_size": c.d_model,
    "intermediate_size": c.mlp_dim,
    "num_hidden_layers": c.n_layers,
    "num_attention_heads": c.n_heads,
    "num_key_value_heads": c.n_kv_heads,
    "head_dim": c.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": c.max_position,
    "rms_norm_eps": c.rms_eps,
    "rope_theta": c.rope_theta,
    "tie_word_embeddings": c.tie_embeddings,
    "torch_dtype": c.param_dtype,
    "use_cache": True,
  }
  if c.family == "qwen2":
    if not c.qkv_bias or c.o_bias or c.qk_norm:
      raise ValueError(
        "family='qwen2' needs qkv_bias=True, o_bias=False, qk_norm=False"
      )
    out["use_sliding_window"] = False
  else:
    if c.qkv_bias != c.o_bias:
      raise ValueError(
        f"family={c.family!r} has one attention_bias flag for "
        "q/k/v/o; qkv_bias and o_bias must agree"
      )
    if c.qk_norm != (c.family == "qwen3"):
      raise ValueError(f"family={c.family!r} and qk_norm={c.qk_norm} disagree")
    out["attention_bias"] = c.qkv_bias
  if c.rope_scaling is not None:
    factor, low, high, original = c.rope_scaling
    out["rope_scaling"] = {
      "rope_type": "llama3",
      "factor": factor,
      "low_freq_factor": low,
      "high_freq_factor": high,
      "original_max_position_embeddings": original,
    }
  return out


# --- Files --------------------------------------------------------------------


def _weight_files(path: str) -> dict[str, str]:
  """HF tensor name -> safetensors file path, from the index or one file."""
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.exists(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (ValueError, KeyError) as e:
      raise CheckpointError(
        f"{index}: not a valid safetensors index ({e})"
      ) from None
    files = {n: os.path.join(path, f) for n, f in weight_map.items()}
    for f in sorted(set(files.values())):
      if not os.path.exists(f):
        raise CheckpointError(
          f"{index} lists {os.path.basename(f)}, which is missing from {path}"
        )
    return files
  if os.path.exists(single):
    with _open(single) as f:
      return {n: single for n in f.keys()}
  raise CheckpointError(
    f"No model.safetensors or model.safetensors.index.json in {path} "
    "(PyTorch .bin checkpoints are not read; re-save with "
    "safe_serialization=True)"
  )


def _open(file: str):
  try:
    return safetensors.safe_open(file, framework="numpy")
  except Exception as e:  # safetensors raises its own error types.
    raise CheckpointError(
      f"{file}: corrupt or unreadable safetensors file "
      f"({type(e).__name__}: {e})"
    ) from None


def read_config(path: str) -> dict:
  file = os.path.join(path, "config.json")
  if not os.path.isdir(path):
    raise CheckpointError(f"Checkpoint directory {path} does not exist")
  if not os.path.exists(file):
    raise CheckpointError(f"{file} is missing")
  try:
    with open(file) as f:
      return json.load(f)
  except ValueError as e:
    raise CheckpointError(f"{file}: invalid JSON ({e})") from None


def load(
  path: str,
  mesh: jax.sharding.Mesh | None = None,
  dtype: str = "float32",
  compute_dtype: str | None = None,
  rules: dict = mesh_lib.TRAIN_RULES,
) -> tuple[ModelConfig, Any]:
  """Loads a local HF checkpoint directory into (ModelConfig, params).

  Args:
    path: directory with config.json and model.safetensors (or sharded files
      with model.safetensors.index.json).
    mesh: place each parameter directly with its sharding under `rules`;
      None puts everything on the first device.
    dtype: parameter dtype ("float32" keeps fp32 master weights).
    compute_dtype: activation dtype; defaults to `dtype`.
    rules: logical-axis rules (mesh.TRAIN_RULES or mesh.ROLLOUT_RULES).
  """
  model_cfg = config_from_hf(
    read_config(path),
    source=os.path.join(path, "config.json"),
    dtype=dtype,
    compute_dtype=compute_dtype,
  )
  files = _weight_files(path)
  shapes = transformer.param_shapes(model_cfg)
  if mesh is None:
    single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: single, shapes)
  else:
    shardings = mesh_lib.shardings(
      mesh, transformer.param_axes(model_cfg), rules, shapes
    )
  names = hf_layout.hf_names(model_cfg)
  handles = {}

  def handle(file):
    if file not in handles:
      handles[file] = _open(file).__enter__()
    return handles[file]

  # Validate every tensor before reading any data.
  flat_shapes = _flatten(shapes)
  for p, (hf_name, kind) in names.items():
    if hf_name not in files:
      raise CheckpointError(
        f"{path}: tensor {hf_name!r} (needed for "
        f"{'/'.join(p)}) is in no safetensors file"
      )
    got = tuple(handle(files[hf_name]).get_slice(hf_name).get_shape())
    want = hf_layout.hf_shape(flat_shapes[p].shape, kind)
    if got != want:
      raise CheckpointError(
        f"{files[hf_name]}: tensor {hf_name!r} has shape {list(got)} but "
        f"config.json implies {list(want)}"
      )
  extra = set(files) - {n for n, _ in names.values()} - {"lm_head.weight"}
  if extra:
    logging.warning(
      "%s: ignoring %d unused tensors, e.g. %s",
      path,
      len(extra),
      sorted(extra)[:3],
    )

  flat_shardings = _flatten(shardings)
  np_dtype = np.dtype(shapes["embedding"].dtype)
  leaves = {}
  progress = _progress(
    len(names), f"loading {path}: tensors", jax.process_index() == 0
  )
  for p, (hf_name, kind) in names.items():
    sl = handle(files[hf_name]).get_slice(hf_name)
    shape = flat_shapes[p].shape
    leaves[p] = jax.make_array_from_callback(
      shape,
      flat_shardings[p],
      lambda index, sl=sl, kind=kind, shape=shape: np.ascontiguousarray(
        hf_layout.read_block(sl, kind, index, shape)
      ).astype(np_dtype),
    )
    progress(len(leaves))
  for h in handles.values():
    h.__exit__(None, None, None)
  return model_cfg, _unflatten(leaves)


def save(
  path: str,
  model_cfg: ModelConfig,
  params,
  max_shard_bytes: int = 4 << 30,
  extra_config: dict | None = None,
):
  """Writes config.json + safetensors (sharded above `max_shard_bytes`).

  Every process calls it (multi-host): the tensors are gathered to the
  host one at a time (mesh.to_host) and process 0 writes each shard file
  once its tensors are in, so a host holds one shard's worth, not the
  model (128 GB for a 32B model in float32). A progress line at most
  every PROGRESS_SECONDS on process 0. A kernel formed at use (a LoRA
  policy over a quantised base: lora.formed) is formed as it is written,
  one at a time.
  """
  writes = jax.process_index() == 0
  if writes:
    os.makedirs(path, exist_ok=True)
  hf_cfg = {**config_to_hf(model_cfg), **(extra_config or {})}
  names = hf_layout.hf_names(model_cfg)
  flat = _flatten(params)
  shapes = {
    p: jax.eval_shape(lora.effective, x) if lora.formed(x) else x
    for p, x in flat.items()
  }
  # Shards planned from the shapes (the HF layout moves no byte).
  shards, size = [[]], 0
  for p in names:
    nbytes = shapes[p].size * np.dtype(shapes[p].dtype).itemsize
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(p)
    size += nbytes
  progress = _progress(len(names), f"writing {path}: tensors", writes)
  meta, weight_map, total, done = {"format": "pt"}, {}, 0, 0
  for i, shard in enumerate(shards):
    file = "model.safetensors"
    if len(shards) > 1:
      file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    tensors = {}
    for p in shard:
      hf_name, kind = names[p]
      # Every process: a collective (a formed kernel is formed here).
      x = mesh_lib.to_host(lora.effective(flat[p]))
      if writes:
        tensors[hf_name] = np.ascontiguousarray(hf_layout.to_hf(x, kind))
      weight_map[hf_name], total = file, total + x.nbytes
      done += 1
      progress(done)
    if writes:
      safetensors.numpy.save_file(tensors, os.path.join(path, file), meta)
  if not writes:
    return
  if len(shards) > 1:
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump(
        {"metadata": {"total_size": total}, "weight_map": weight_map},
        f,
        indent=2,
      )
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)


def _progress(total: int, label: str, shown: bool):
  """A throttled progress callback (tensors done), silent where not
  `shown`."""
  if not shown:
    return lambda done: None
  return metrics_lib.Progress(total, label=label, every=PROGRESS_SECONDS).maybe


def _flatten(tree) -> dict[tuple[str, ...], Any]:
  out = {}
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lora.formed)[0]
  for path, leaf in leaves:
    out[tuple(k.key for k in path)] = leaf
  return out


def _unflatten(flat: dict[tuple[str, ...], Any]):
  tree = {}
  for path, leaf in flat.items():
    node = tree
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = leaf
  return tree
