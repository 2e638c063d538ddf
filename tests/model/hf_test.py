"""HF checkpoint parity: random tiny models written by transformers itself."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import mesh as mesh_lib
from rlreason.model import policy
from rlreason import testing
from rlreason.model import hf
from rlreason.model import transformer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_COMMON = dict(
  vocab_size=211,
  hidden_size=64,
  intermediate_size=96,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  max_position_embeddings=256,
)

FAMILIES = {
  "qwen2": lambda: transformers.Qwen2Config(
    **_COMMON, tie_word_embeddings=False, rope_theta=10_000.0
  ),
  "llama": lambda: transformers.LlamaConfig(
    **_COMMON,
    tie_word_embeddings=False,
    attention_bias=True,
    rms_norm_eps=1e-5,
    rope_theta=500_000.0,
    rope_scaling={
      "rope_type": "llama3",
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32,
    },
  ),
  # head_dim * heads != hidden_size, tied embeddings, q/k norm.
  "qwen3": lambda: transformers.Qwen3Config(
    **_COMMON, head_dim=24, tie_word_embeddings=True, rope_theta=1_000_000.0
  ),
}


def _write_hf_model(family, path, seed=0):
  torch.manual_seed(seed)
  cfg = FAMILIES[family]()
  cfg._attn_implementation = "eager"
  model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
  with torch.no_grad():  # Randomise norms and biases too (HF inits 1 and 0).
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(path, safe_serialization=True)
  return model


def _tokens(vocab, n=3, s=17, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, size=(n, s))


def _hf_logits(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(tokens)).logits.float().numpy()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_transformers(family, tmp_path):
  model = _write_hf_model(family, tmp_path)
  model_cfg, params = hf.load(str(tmp_path))
  assert model_cfg.family == family
  tokens = _tokens(model_cfg.vocab_size)
  ours = np.asarray(policy.logits(params, jnp.asarray(tokens), model_cfg))
  theirs = _hf_logits(model, tokens)
  # Two frameworks' float32 programs: equal up to rounding.
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_reloads_in_transformers(family, tmp_path):
  model_cfg = testing.tiny_model_config(
    vocab_size=97,
    mlp_dim=48,
    qkv_bias=family == "qwen2",
    qk_norm=family == "qwen3",
    tie_embeddings=family == "qwen3",
    rope_scaling=(8.0, 1.0, 4.0, 32) if family == "llama" else None,
    family=family,
  )
  params = transformer.init(model_cfg, jax.random.key(1))
  # Several shards, so the index path is exercised too.
  hf.save(str(tmp_path), model_cfg, params, max_shard_bytes=20_000)
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  model = transformers.AutoModelForCausalLM.from_pretrained(
    str(tmp_path), attn_implementation="eager"
  ).eval()
  tokens = _tokens(97, seed=3)
  ours = np.asarray(policy.logits(params, jnp.asarray(tokens), model_cfg))
  np.testing.assert_allclose(
    ours, _hf_logits(model, tokens), rtol=1e-5, atol=1e-4
  )
  cfg2, params2 = hf.load(str(tmp_path))
  assert cfg2 == model_cfg
  jax.tree.map(np.testing.assert_array_equal, params, params2)  # a copy


def test_save_writes_each_shard_once_its_tensors_are_gathered(
  tmp_path, monkeypatch, capsys
):
  """hf.save gathers one tensor at a time and writes a shard as soon as
  its tensors are in (a host never holds the whole model); with a due
  progress line, saving and loading say how many tensors are done."""
  monkeypatch.setattr(hf, "PROGRESS_SECONDS", 0.0)
  model_cfg = testing.tiny_model_config(vocab_size=97, qkv_bias=True)
  params = transformer.init(model_cfg, jax.random.key(1))
  events = testing.spy(
    monkeypatch, hf.mesh_lib, "to_host", lambda x: ("get", x.nbytes)
  )
  write = hf.safetensors.numpy.save_file
  monkeypatch.setattr(
    hf.safetensors.numpy,
    "save_file",
    lambda tensors, file, meta: (
      events.append(("write", sum(x.nbytes for x in tensors.values()))),
      write(tensors, file, meta),
    ),
  )
  hf.save(str(tmp_path), model_cfg, params, max_shard_bytes=20_000)
  writes = [i for i, e in enumerate(events) if e[0] == "write"]
  assert len(writes) >= 3 and writes[-1] == len(events) - 1
  last = -1
  for i in writes:  # a shard is the tensors gathered since the last write
    assert events[i][1] == sum(n for _, n in events[last + 1 : i])
    last = i
  tensors = len(events) - len(writes)
  saved = capsys.readouterr().err.splitlines()
  assert len(saved) == tensors and saved[-1].startswith(
    f"writing {tmp_path}: tensors {tensors}/{tensors} | "
  )
  _, again = hf.load(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, params, again)
  loaded = capsys.readouterr().err.splitlines()
  assert len(loaded) == tensors and loaded[0].startswith(
    f"loading {tmp_path}: tensors 1/{tensors} | "
  )


def test_load_sharded_places_params_on_mesh(tmp_path):
  model = _write_hf_model("qwen2", tmp_path)
  mesh = mesh_lib.make_mesh(2, 2, 2)
  model_cfg, params = hf.load(str(tmp_path), mesh=mesh)
  q = params["layer_0"]["attn"]["q_kernel"]  # [D, H, Dh] = (embed, heads, -)
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert len(q.addressable_shards) == 8
  assert q.addressable_shards[0].data.shape == (32, 2, 16)
  tokens = _tokens(model_cfg.vocab_size)
  ours = np.asarray(policy.logits(params, jnp.asarray(tokens), model_cfg))
  np.testing.assert_allclose(
    ours, _hf_logits(model, tokens), rtol=1e-5, atol=1e-4
  )


# --- Bad input ----------------------------------------------------------------


def test_missing_safetensors_file(tmp_path):
  model_cfg = transformer.ModelConfig(
    vocab_size=64,
    d_model=16,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    head_dim=8,
    mlp_dim=16,
    qkv_bias=True,
  )
  params = transformer.init(model_cfg, jax.random.key(0))
  hf.save(str(tmp_path), model_cfg, params, max_shard_bytes=3000)
  victim = sorted(
    p for p in os.listdir(tmp_path) if p.endswith(".safetensors")
  )[1]
  os.remove(tmp_path / victim)
  with pytest.raises(hf.CheckpointError, match=victim):
    hf.load(str(tmp_path))


def test_no_weights_at_all(tmp_path):
  (tmp_path / "config.json").write_text(
    json.dumps(
      hf.config_to_hf(
        transformer.ModelConfig(
          vocab_size=64,
          d_model=16,
          n_layers=1,
          n_heads=2,
          n_kv_heads=1,
          head_dim=8,
          mlp_dim=16,
          qkv_bias=True,
        )
      )
    )
  )
  with pytest.raises(hf.CheckpointError, match="No model.safetensors"):
    hf.load(str(tmp_path))


def test_corrupt_safetensors_file(tmp_path):
  _write_hf_model("qwen2", tmp_path)
  file = tmp_path / "model.safetensors"
  data = file.read_bytes()
  file.write_bytes(data[:8] + b"{garbage" + data[16:200])
  with pytest.raises(hf.CheckpointError, match=r"model\.safetensors: corrupt"):
    hf.load(str(tmp_path))


def test_truncated_safetensors_file(tmp_path):
  _write_hf_model("qwen2", tmp_path)
  file = tmp_path / "model.safetensors"
  file.write_bytes(file.read_bytes()[:-1000])
  with pytest.raises(
    hf.CheckpointError, match=r"model\.safetensors: corrupt.*not fully covered"
  ):
    hf.load(str(tmp_path))


def test_shape_disagrees_with_config(tmp_path):
  _write_hf_model("llama", tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  cfg["intermediate_size"] = 128  # the file holds 96
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(
    hf.CheckpointError,
    match=r"model\.layers\.0\.mlp\.gate_proj\.weight.*"
    r"\[96, 64\].*\[128, 64\]",
  ):
    hf.load(str(tmp_path))


def test_unsupported_architecture(tmp_path):
  _write_hf_model("qwen2", tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  cfg["architectures"] = ["GPT2LMHeadModel"]
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(
    hf.CheckpointError, match="unsupported architecture 'GPT2LMHeadModel'"
  ):
    hf.load(str(tmp_path))


def test_missing_directory_and_config(tmp_path):
  with pytest.raises(hf.CheckpointError, match="does not exist"):
    hf.load(str(tmp_path / "nope"))
  with pytest.raises(hf.CheckpointError, match="config.json is missing"):
    hf.load(str(tmp_path))
