"""The reward-model stage of RLHF, before the RL (experiments/rm_grpo.py).

InstructGPT (arXiv:2203.02155, Sec. 3.5) trains a scalar reward model on
ranked comparisons of its SFT model's responses; here the warm-start
policy samples --rm_samples completions for each of --rm_prompts training
prompts (`preference_data`), the verifier labels them, and
rewards/bradley_terry.py's preference_pairs and train_bt give the
Bradley-Terry-trained model (`train_reward_model`), scored for pairwise
accuracy on the pairs of held-out prompts. `cached_reward_model` keeps it
under --cache_dir by the settings it depends on (`settings`): a resumed
run, or another variant, does not retrain it; a run stopped while it
trains keeps its samples (<cache>/rm-<key>.partial) and checkpoints the
Bradley-Terry steps there, both taken up by the rerun. Reads the rm_*
fields of rm_grpo's Config.
"""

import contextlib
import hashlib
import json
import os
import shutil

import jax
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.data import sources as data_lib
from rlreason.rewards import bradley_terry as bt
from rlreason.rewards import model as rm
from rlreason.rl import objective
from rlreason.sampling import draw as sampling_lib
from rlreason.train import checkpoint
from rlreason.train import train_step as ts


def settings(cfg) -> dict:
  """The config fields the reward model depends on: its cache key."""
  keys = (
    "init_from",
    "model",
    "tokenizer",
    "data",
    "template",
    "seed",
    "max_prompt_len",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "reward",
    "rm_prompts",
    "rm_samples",
    "rm_pairs_per_prompt",
    "rm_heldout",
    "rm_steps",
    "rm_batch_size",
    "rm_lr",
    "rm_batching",
  )
  out = {k: getattr(cfg, k) for k in keys}
  if cfg.rm_schedule != "constant":  # the keys of models trained before it
    out["rm_schedule"] = cfg.rm_schedule
  return out


def _left_pad(arrays, fill):
  """[n_i, S_i] arrays -> one [sum n_i, max S_i] array, padded on the left
  (the RM reads each row's last real token, wherever the padding is)."""
  width = max(a.shape[1] for a in arrays)
  return np.concatenate(
    [
      np.pad(a, ((0, 0), (width - a.shape[1], 0)), constant_values=fill)
      for a in arrays
    ]
  )


def preference_data(cfg, ctx, params):
  """Samples of the policy on --rm_prompts training prompts, labelled.

  Returns:
    tokens, positions [R, S] (prompt + completion, R = prompts * samples,
    prompt-major), correct [R], and the prompt count.
  """
  examples = data_lib.load(cfg.data, "train")
  pick = np.random.default_rng(cfg.seed).permutation(len(examples))
  examples = [examples[i] for i in pick[: cfg.rm_prompts]]
  sampling = sampling_lib.Sampling(
    temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k
  )
  # Keys apart from the RL loop's (which folds in the step).
  rng = jax.random.fold_in(jax.random.key(cfg.seed), 1 << 20)
  toks, pos, correct = [], [], []
  for i, lo in enumerate(range(0, len(examples), cfg.batch_size)):
    part = examples[lo : lo + cfg.batch_size]
    ro = ctx.generate(
      params, part, rng, i, group_size=cfg.rm_samples, sampling=sampling
    )
    t, p = mesh_lib.to_host((ro.tokens, ro.positions))
    toks.append(t)
    pos.append(p)
    correct.append(objective.correctness(ro, part, ctx))
  return (
    _left_pad(toks, ctx.tokenizer.pad_id),
    _left_pad(pos, -1),
    np.concatenate(correct),
    len(examples),
  )


def kept_preference_data(cfg, ctx, params, directory: str | None):
  """preference_data, kept in `directory`/data.npz once sampled (each
  process writes its own copy, atomically), so a run stopped while its
  reward model trains samples them once."""
  path = os.path.join(directory, "data.npz") if directory else None
  if path and os.path.exists(path):
    print(f"Reward model: preference data from {path}", flush=True)
    with np.load(path) as f:
      return f["tokens"], f["positions"], f["correct"], int(f["prompts"])
  tokens, positions, correct, n_prompts = preference_data(cfg, ctx, params)
  if path:
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.{jax.process_index()}.tmp.npz"
    np.savez(
      tmp, tokens=tokens, positions=positions, correct=correct,
      prompts=n_prompts,
    )  # fmt: skip
    os.replace(tmp, path)
  return tokens, positions, correct, n_prompts


def train_reward_model(cfg, ctx, params, partial: str | None = None):
  """Preference pairs from the policy's samples -> BT-trained RM;
  `partial` keeps the samples until it is trained (kept_preference_data).

  Returns:
    (RM params, info dict: pair counts, held-out / train pairwise accuracy,
    the samples' verifier accuracy, BT losses, mu and sigma of (2)).
  """
  tokens, positions, correct, n_prompts = kept_preference_data(
    cfg, ctx, params, partial
  )
  chosen, rejected = bt.preference_pairs(
    correct, cfg.rm_samples, max_pairs=cfg.rm_pairs_per_prompt, seed=cfg.seed
  )
  # Held-out pairs come from held-out prompts (the last ones drawn).
  n_held = max(1, round(cfg.rm_heldout * n_prompts))
  held = chosen // cfg.rm_samples >= n_prompts - n_held
  pair = lambda idx: (tokens[idx], positions[idx])
  train_c, train_r = pair(chosen[~held]), pair(rejected[~held])
  held_c, held_r = pair(chosen[held]), pair(rejected[held])
  model_cfg = ctx.model_cfg
  init = rm.init(model_cfg, jax.random.key(cfg.seed), backbone=params)
  print(
    f"Reward model: {len(train_c[0])} train / {len(held_c[0])} held-out "
    f"pairs from {len(correct)} samples (verifier accuracy "
    f"{correct.mean():.3f}); {cfg.rm_steps} Bradley-Terry steps",
    flush=True,
  )
  # SIGTERM or Ctrl-C while it trains: checkpointed, resumed.
  resume = None
  if partial is not None:
    bt_dir = os.path.join(os.path.abspath(partial), "bt")
    resume = checkpoint.Resumable(bt_dir, "reward model training")
  # Its signal handlers go however the training ends.
  with resume or contextlib.nullcontext():
    trained, losses = bt.train_bt(
      init,
      model_cfg,
      train_c,
      train_r,
      steps=cfg.rm_steps,
      batch_size=cfg.rm_batch_size,
      lr=cfg.rm_lr,
      seed=cfg.seed,
      log_every=max(1, cfg.rm_steps // 10),
      mesh=ctx.mesh,
      micro_batches=cfg.rm_micro_batches,
      # A train step too: under the policy's --train_temp_budget_mib.
      compiler_options=ts.compiler_options(cfg.train_temp_budget_mib, ctx.mesh),
      resume=resume,
      # InstructGPT's batching (--rm_batching=prompt): the pairs' prompts.
      groups=(
        chosen[~held] // cfg.rm_samples if cfg.rm_batching == "prompt" else None
      ),
      schedule=cfg.rm_schedule,
    )
  on_mesh = dict(batch_size=ctx.score_rows, mesh=ctx.mesh)
  s = rm.scores(
    trained, tokens, positions, model_cfg, rows=ctx.score_rows, mesh=ctx.mesh
  )
  nan_none = lambda x: None if np.isnan(x) else float(x)
  info = {
    "pairs_train": int(len(train_c[0])),
    "pairs_heldout": int(len(held_c[0])),
    "heldout_pair_accuracy": nan_none(
      bt.pairwise_accuracy(trained, held_c, held_r, model_cfg, **on_mesh)
    ),
    "train_pair_accuracy": nan_none(
      bt.pairwise_accuracy(trained, train_c, train_r, model_cfg, **on_mesh)
    ),
    "sample_accuracy": float(correct.mean()),
    "bt_loss_first": losses[0] if losses else None,
    "bt_loss_last": float(np.mean(losses[-10:])) if losses else None,
    "score_mean": float(s.mean()),
    "score_std": float(s.std()),
  }
  print(f"Reward model: {info}", flush=True)
  return trained, info


def cached_reward_model(cfg, ctx, params):
  """train_reward_model, cached under cfg.cache_dir by its settings."""
  key_fields = settings(cfg)
  key = hashlib.sha256(
    json.dumps(key_fields, sort_keys=True).encode()
  ).hexdigest()[:16]
  out = os.path.join(cfg.cache_dir, f"rm-{key}")
  if os.path.exists(os.path.join(out, "reward_model.json")):
    with open(os.path.join(out, "reward_model.json")) as f:
      info = json.load(f)["info"]
    print(f"Reward model: reusing {out}", flush=True)
    return rm.load_params(os.path.join(out, "params.safetensors")), info
  partial = out + ".partial"  # the samples, while the RM trains
  trained, info = train_reward_model(cfg, ctx, params, partial)
  tmp = out + ".tmp"
  os.makedirs(tmp, exist_ok=True)
  rm.save_params(os.path.join(tmp, "params.safetensors"), trained)
  with open(os.path.join(tmp, "reward_model.json"), "w") as f:
    json.dump({"settings": key_fields, "info": info}, f, indent=2)
  os.replace(tmp, out)  # Atomic: a killed run never leaves half a cache.
  shutil.rmtree(partial, ignore_errors=True)
  return trained, info
