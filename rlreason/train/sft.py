"""Supervised fine-tuning: teacher forcing on prompt + reference solution.

The loss covers completion tokens only (the solution and its EOS). It runs
through the same model, mesh, train step and checkpoint code as RL. Used for
warm starts (`warm_start`, cached on disk so a rerun skips it) and for SFT /
expert-iteration baselines (`train_on_pairs`).
"""

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil

import jax
import numpy as np
from absl import logging

from rlreason.rl import aggregation
from rlreason.data import sources as data_lib
from rlreason.guidance import hints as hints_lib
from rlreason import mesh as mesh_lib
from rlreason import metrics as metrics_lib
from rlreason.model import policy
from rlreason.sampling import padding
from rlreason.train import checkpoint
from rlreason.train import loaders
from rlreason.train import optimizer as optimizer_lib
from rlreason.train import train_step as ts
from rlreason.model import hf


def nll_loss(params, batch, norm, *, model_cfg, mode="token-mean"):
  """Mean negative log-likelihood of the completion tokens."""
  prompt_len = batch["tokens"].shape[1] - batch["mask"].shape[1]
  logp = policy.completion_logprobs(
    params, batch["tokens"], batch["positions"], model_cfg, prompt_len
  )
  loss = aggregation.aggregate(-logp, batch["mask"], mode, **norm)
  return loss, {"nll": loss}


def rejection_sampled(
  correct, texts, group_size: int, *, dedup: bool = True
) -> np.ndarray:
  """[N] 0/1: the completions expert iteration imitates.

  Rejection sampling (expert iteration in Havrilla et al. 2024,
  arXiv:2403.04642; STaR, RAFT, ReST-EM): keep the verified-correct
  samples and, with `dedup`, only the first copy of each distinct
  completion text of a prompt, so that a repeated solution is not
  weighted up.

  Args:
    correct: [N] 0/1 correctness (> 0 = correct), N = B * G.
    texts: N completion strings, each prompt's G contiguous.
    group_size: G.
    dedup: drop later duplicates within a group.
  """
  keep = np.asarray(correct, np.float32) > 0
  if dedup:
    for lo in range(0, len(texts), group_size):
      seen = set()
      for i in range(lo, lo + group_size):
        if keep[i]:
          keep[i] = texts[i] not in seen
          seen.add(texts[i])
  return keep.astype(np.float32)


def off_by_one(solution: str) -> str:
  """The solution with its final integer answer increased by one.

  A systematically wrong demonstrator (see `encode_pairs`). The answer is a
  last line `answer: <integer>` or `<answer><integer></answer>` (the tagged
  tasks, tasks/tagged.py); other solutions are returned unchanged.
  """
  head, _, last = solution.rstrip().rpartition("\n")
  tagged = re.fullmatch(r"<answer>(-?\d+)</answer>", last.strip())
  if tagged:
    last = f"<answer>{int(tagged.group(1)) + 1}</answer>"
    return f"{head}\n{last}" if head else last
  prefix, _, value = last.partition(": ")
  try:
    wrong = int(value) + 1
  except ValueError:
    return solution
  return f"{head}\n{prefix}: {wrong}" if head else f"{prefix}: {wrong}"


def encode_pairs(
  tok,
  template: str,
  examples,
  *,
  noise: float = 0.0,
  seed: int = 0,
  hints: float = 0.0,
  max_prompt_len: int | None = None,
) -> tuple[list, list]:
  """(prompt ids, completion ids + EOS) for examples with a solution.

  `noise` is the fraction of demonstrations (chosen by `seed`) whose final
  answer line is off by one: a warm start that imitates an imperfect
  demonstrator, as SFT on a weaker model's traces does, which only a reward
  signal can correct.

  `hints` is the fraction whose prompt shows a hint before the question
  (`hinted_demo`), so that a model trained from scratch learns to read the
  guidance the hint-guided methods give (an instruction-tuned LM already
  can); the completion is the exact reference solution (never off by one:
  a demonstration that contradicted its hint would teach ignoring it).
  """
  missing = [e.uid for e in examples if not e.solution]
  if missing:
    raise ValueError(
      f"SFT needs reference solutions; {len(missing)} "
      f"examples have none (e.g. {missing[:3]})"
    )
  rng = np.random.default_rng(seed)
  noisy = rng.random(len(examples)) < noise
  if hints > 0:
    hint_rng = np.random.default_rng([seed, 1])
    chosen = hint_rng.random(len(examples)) < hints
    examples = [
      hinted_demo(tok, template, e, hint_rng, max_prompt_len) if c else e
      for e, c in zip(examples, chosen)
    ]
    # A hinted demonstration follows its hint: never off by one.
    noisy &= ~np.asarray([hints_lib.is_hinted(e) for e in examples])
  prompts = [
    tok.encode(hints_lib.prompt_text(tok, e, template)) for e in examples
  ]
  completions = [
    tok.encode(off_by_one(e.solution) if bad else e.solution) + [tok.eos_id]
    for e, bad in zip(examples, noisy)
  ]
  return prompts, completions


def hinted_demo(tok, template: str, example, rng, max_prompt_len=None):
  """`example` with a hint before its question: the first k >= 1 of its
  knowledge points (k uniform) or, half the time, the whole reference
  solution as an expert's (hints.knowledge_hint / expert_hint). The longest
  such hint whose prompt fits max_prompt_len tokens; none if none fits."""
  if example.knowledge and rng.random() < 0.5:
    k = int(rng.integers(1, len(example.knowledge) + 1))
    options = [
      hints_lib.knowledge_hint(example.knowledge, j) for j in range(k, 0, -1)
    ]
  else:
    options = [hints_lib.expert_hint(example.solution)]
  for hint in options:
    hinted = hints_lib.with_hint(example, hint=hint)
    text = hints_lib.prompt_text(tok, hinted, template)
    if max_prompt_len is None or len(tok.encode(text)) <= max_prompt_len:
      return hinted
  return example


def train_on_pairs(
  params,
  model_cfg,
  tok,
  prompts,
  completions,
  *,
  mesh,
  steps: int,
  batch_size: int,
  lr: float,
  max_prompt_len: int,
  max_new_tokens: int,
  seed: int = 0,
  log_every: int = 50,
  label: str = "sft",
  resume_dir: str | None = None,
  length_groups: int = 0,
):
  """Teacher-forced training on (prompt, completion) id pairs; returns params.

  Batches are drawn without replacement, epoch after epoch, deterministic in
  `seed`. With `length_groups` = k > 0, each epoch's draw order is sorted
  within windows of k batches (the batches then shuffled) by prompt width
  (the longest prompt's multiple of 32, as `padding.pack` pads it), then by
  completion length, and a batch is padded to its own longest completion
  rounded up to 32 tokens (at most max_new_tokens): less padding for
  corpora of mixed lengths (a few long hinted prompts no longer widen most
  batches), at the price of one compiled step per (prompt, completion)
  width. With `resume_dir`, SIGTERM or Ctrl-C checkpoints the training
  there (state, step, the draw order) and raises checkpoint.Stopped, and
  it is saved there every checkpoint.SAVE_SECONDS too; a later call with
  the same arguments resumes it and ends as an uninterrupted one would.
  """
  optimizer = optimizer_lib.make_optimizer(
    lr,
    total_steps=steps,
    warmup_steps=min(20, steps // 10),
    schedule="cosine",
    grad_clip=1.0,
  )
  state, step_fn, batch_sh = ts.setup(
    mesh,
    model_cfg,
    params,
    optimizer,
    functools.partial(nll_loss, model_cfg=model_cfg),
  )
  rng = np.random.default_rng(seed)
  lengths = np.asarray([len(c) for c in completions])
  if length_groups:
    group_key = _group_key(prompts, lengths, max_new_tokens)
  order = np.array([], np.int64)
  start, resume = 0, None
  if resume_dir:
    resume = checkpoint.Resumable(resume_dir, label)
    restored, meta = resume.restore(state)
    if restored is not None:
      state, start = restored, meta["step"]
      rng.bit_generator.state = meta["rng"]
      order = np.asarray(meta["order"], np.int64)
      print(f"{label}: resuming from step {start}", flush=True)
  try:
    progress = metrics_lib.Progress(steps, start, label=label)
    for step in range(start, steps):
      if len(order) < batch_size:
        epoch = rng.permutation(len(prompts))
        if length_groups:
          epoch = _length_grouped(
            epoch, group_key, batch_size, length_groups, rng
          )
        order = np.concatenate([order, epoch])
      idx, order = order[:batch_size], order[batch_size:]
      width = max_new_tokens
      if length_groups:
        width = min(width, -(-max(lengths[i] for i in idx) // 32) * 32)
      batch = padding.pack(
        [prompts[i] for i in idx],
        [completions[i] for i in idx],
        tok.pad_id,
        max_prompt_len,
        width,
      )
      state, m = step_fn(state, mesh_lib.put_global(batch, batch_sh))
      if (step + 1) % log_every == 0 or step + 1 == steps:
        progress.update(step + 1, {"loss": m["loss"]})
      if resume is not None:
        meta = lambda order=order: {  # noqa: E731 - called when it saves
          "order": order.tolist(),
          "rng": rng.bit_generator.state,
        }
        resume.maybe_stop(step + 1, steps, state, meta)
  finally:
    if resume is not None:
      resume.close()  # the handlers, however it ends
  return state.params


def _group_key(prompts, lengths, max_new_tokens: int) -> np.ndarray:
  """Sort key of length grouping: the prompt's width bucket (multiples of
  32, as `padding.pad_prompts` pads a batch), then the completion length."""
  width = np.asarray([-(-len(p) // 32) for p in prompts], np.int64)
  return width * (max_new_tokens + 1) + np.minimum(lengths, max_new_tokens)


def _length_grouped(epoch, keys, batch_size, groups, rng):
  """`epoch` re-ordered: sorted by `keys` (lengths) within windows of
  `groups` batches, then whole batches shuffled."""
  window = batch_size * groups
  parts = [
    epoch[i : i + window][
      np.argsort(keys[epoch[i : i + window]], kind="stable")
    ]
    for i in range(0, len(epoch), window)
  ]
  ordered = np.concatenate(parts)
  batches = [
    ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)
  ]
  full = [b for b in batches if len(b) == batch_size]
  tail = [b for b in batches if len(b) < batch_size]
  return np.concatenate([full[i] for i in rng.permutation(len(full))] + tail)


def warm_start_settings(cfg) -> dict:
  """Every setting the warm start of `cfg` depends on: its cache key.

  Two configs with equal settings start from the same checkpoint.
  """
  settings = {
    k: getattr(cfg, k)
    for k in (
      "model",
      "tokenizer",
      "data",
      "template",
      "seed",
      "warm_start_steps",
      "warm_start_lr",
      "warm_start_batch_size",
      "max_prompt_len",
      "max_new_tokens",
      "param_dtype",
      "warm_start_noise",
    )
  }
  if cfg.warm_start_hints:  # keyed only when used: older caches stay valid
    settings["warm_start_hints"] = cfg.warm_start_hints
  if cfg.warm_start_noise and "_tags" in cfg.data:
    # Tagged answers are noised since 2026-11-22; older caches are exact.
    settings["noisy_tags"] = True
  return settings


def warm_start(cfg, cache_dir: str | None = None) -> str:
  """Runs (or reuses) the SFT warm start of `cfg`; returns its HF directory.

  The result is cached under a key of every setting it depends on, so a
  rerun (or another experiment with the same base) skips it.
  """
  settings = warm_start_settings(cfg)
  key = hashlib.sha256(
    json.dumps(settings, sort_keys=True).encode()
  ).hexdigest()[:16]
  out = os.path.join(cache_dir or cfg.cache_dir, f"sft-{key}")
  if os.path.exists(os.path.join(out, "config.json")):
    logging.info("Warm start: reusing %s", out)
    return out
  mesh = mesh_lib.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
  base = dataclasses.replace(cfg, init_from="")
  model_cfg, params = loaders.load_model(base, mesh)
  tok = loaders.load_tokenizer(base)
  examples = data_lib.load(cfg.data, "train")
  prompts, completions = encode_pairs(
    tok,
    cfg.template,
    examples,
    noise=cfg.warm_start_noise,
    seed=cfg.seed,
    hints=cfg.warm_start_hints,
    max_prompt_len=cfg.max_prompt_len,
  )
  print(
    f"Warm start: SFT for {cfg.warm_start_steps} steps on "
    f"{len(examples)} {cfg.data} solutions -> {out}",
    flush=True,
  )
  cut = sum(len(c) > cfg.max_new_tokens for c in completions)
  if cut:  # padding.pack drops their tails from the loss
    print(
      f"Warm start: {cut} of {len(completions)} demonstrations are longer "
      f"than its {cfg.max_new_tokens} completion tokens and are cut",
      flush=True,
    )
  partial = out + ".partial"  # SIGTERM's checkpoint, resumed by a rerun
  params = train_on_pairs(
    params,
    model_cfg,
    tok,
    prompts,
    completions,
    mesh=mesh,
    steps=cfg.warm_start_steps,
    batch_size=cfg.warm_start_batch_size,
    lr=cfg.warm_start_lr,
    max_prompt_len=cfg.max_prompt_len,
    max_new_tokens=cfg.max_new_tokens,
    seed=cfg.seed,
    label="warm start",
    resume_dir=partial,
  )
  # Every process takes part in gathering the parameters, one tensor at a
  # time (hf.save); process 0 writes.
  tmp = out + ".tmp"
  if jax.process_index() == 0:  # a killed run's half-written copy
    shutil.rmtree(tmp, ignore_errors=True)
  hf.save(tmp, model_cfg, params)
  if jax.process_index() == 0:
    with open(os.path.join(tmp, "warm_start.json"), "w") as f:
      json.dump(settings, f, indent=2)
    os.replace(tmp, out)  # Atomic: a killed run never leaves half a cache.
    if os.path.exists(partial):
      shutil.rmtree(partial)
  if jax.process_count() > 1:  # Others read what process 0 wrote.
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(f"warm_start {key}")
  return out


def will_warm_start(cfg) -> bool:
  """Whether `cfg` starts from an SFT warm start: --warm_start_steps > 0
  and no --init_from."""
  return bool(cfg.warm_start_steps) and not cfg.init_from


def warm_started(cfg, **overrides):
  """`cfg` starting from its warm start, when it asks for one.

  Unless --warm_start_steps is 0 or --init_from is set, returns `cfg` with
  init_from = warm_start(cfg with `overrides`): an experiment may warm-start
  on other data or lengths than it trains on (e.g. data=the train split,
  max_new_tokens=whole responses).
  """
  if not will_warm_start(cfg):
    return cfg
  base = dataclasses.replace(cfg, **overrides)
  return dataclasses.replace(cfg, init_from=warm_start(base))
