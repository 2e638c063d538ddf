"""The shared RL loop: rollout -> rewards -> advantages -> updates -> logs.

  loop.train(cfg, make_batch=make_batch, loss_fn=loss_fn, name="grpo")

An experiment supplies two functions:

  make_batch(rollout, examples, ctx) -> (batch, metrics)
      Host side, on WHOLE groups (before any minibatch split): rewards,
      advantages, filters. `batch` is a dict of [N, ...] numpy arrays; start
      from `ctx.batch_from_rollout(rollout)` and add "adv" etc.
  loss_fn(params, batch, norm, *, cfg, model_cfg) -> (loss, metrics)
      Pure; `norm` holds the whole minibatch's normalisers
      (aggregation.normalizers). Bound with functools.partial and jitted.

Everything else (mesh, model, data, checkpoints, metrics, evaluations:
evaluations.py, preemption, resume) is run from here, once. An
experiment's `run(cfg)` is `train_and_report`: `train`, then the run's
report.md (rlreason/train/report.py).
The workdir may be local or gs:// (rlreason/storage.py).
"""

import contextlib
import copy
import dataclasses
import functools
import os
import time
from typing import Any, Callable

import jax
import numpy as np
from absl import logging

from rlreason.train import adapters as adapters_lib
from rlreason.train import checkpoint
from rlreason.train import evaluations
from rlreason.train import preemption
from rlreason.train import preflight
from rlreason.train import run_info
from rlreason.train import context as context_lib
from rlreason.train import loaders
from rlreason.data import iterator
from rlreason.envs import multiturn
from rlreason import devices
from rlreason import mesh as mesh_lib
from rlreason import metrics as metrics_lib
from rlreason.train import report
from rlreason.sampling import draw as sampling_lib
from rlreason.train import sft
from rlreason.train import train_step as ts
from rlreason.model import transformer


def train(cfg, **kwargs) -> dict[str, Any]:
  """Runs (or resumes) an RL experiment; returns the final metrics.

  SIGTERM or Ctrl-C, from its start on, or --stop_after_hours since it,
  stops it with a checkpoint: the warm start's step under way finishes;
  an RL step stops at its next sampler call (checkpointed as of the
  step's start; the rows its rollouts finished kept in their journal,
  run_info.rollout_journal, for the rerun) or after its updates; an
  evaluation after its chunk under way (resumed from its journal by the
  rerun, before anything else). A second Ctrl-C stops it at once. A long
  compilation says so as it runs (metrics.compile_lines). Arguments:
  `_train`'s.
  """
  cfg.validate()
  # Before the handlers: jax.distributed's own SIGTERM handler (its
  # preemption notifier) would replace them.
  run_info.maybe_initialize_distributed(cfg)
  deadline = preemption.after_hours(cfg.stop_after_hours)
  with (
    preemption.Preemption(deadline=deadline) as preempt,
    metrics_lib.compile_lines(jax.process_index() == 0),  # minutes at scale
    contextlib.ExitStack() as closing,
  ):
    return _train(cfg, preempt=preempt, closing=closing, **kwargs)


def _train(
  cfg,
  *,
  preempt: preemption.Preemption,
  closing: contextlib.ExitStack,
  make_batch: Callable,
  loss_fn: Callable,
  name: str,
  needs_ref: bool = False,
  extra_params: Callable | None = None,
  prompt_iterator: Callable | None = None,
  generate_fn: Callable | None = None,
) -> dict[str, Any]:
  """`train`'s body, `preempt` and `closing` set by it: `closing` closes
  the checkpointer and the metrics writer however the run ends (an error's
  way finishes a checkpoint write in flight: Checkpointer.__exit__).

  `prompt_iterator(cfg, train_examples)` replaces the default
  iterator.default (e.g. curriculum.StagedPrompts); it must offer
  `next()`, `state()` and `restore(state)` like PromptIterator.

  `generate_fn` replaces the sampler (Context.generate_fn), e.g.
  multiturn.make_generate_fn for environment episodes.

  `extra_params(cfg, model_cfg, params) -> types.ExtraParams` adds
  parameters trained beside the policy's (e.g. a critic,
  value.extra_params) under their own top-level keys: loss_fn gets them in
  `params`, make_batch in `ctx.extra`; rollouts and evaluations see the
  policy's alone; checkpoints hold both.
  """
  checked = preflight.check_run(cfg, name, needs_ref)
  cfg, workdir = checked.cfg, checked.workdir
  train_examples, eval_examples = checked.train_examples, checked.eval_examples
  scope = evaluations.scope(cfg, train_examples, eval_examples)
  cfg = sft.warm_started(cfg)
  is_main = jax.process_index() == 0
  if is_main:
    run_info.write_run_info(workdir, cfg)

  # --- Mesh, model, optimizer -------------------------------------------------
  mesh = mesh_lib.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
  tok = checked.tokenizer  # a warm start's is --model's, as checked
  model_cfg, params = loaders.load_model(cfg, mesh)
  if tok.vocab_size > model_cfg.vocab_size:
    raise ValueError(
      f"Tokenizer has {tok.vocab_size} ids but the model only "
      f"{model_cfg.vocab_size}"
    )
  run = adapters_lib.trainable(
    cfg, model_cfg, params, mesh, loss_fn, needs_ref, extra_params
  )
  del params
  state, step_fn, batch_sh = run.state, run.step_fn, run.batch_sh
  policy_of, extra_keys = run.policy_of, run.extra_keys
  updates_per_step = cfg.ppo_epochs * (cfg.minibatches + run.extra_minibatches)

  ctx = context_lib.Context(
    cfg,
    model_cfg,
    tok,
    mesh,
    checked.reward_fn,
    checked.correct_fn,
    run.ref_params,
  )
  ctx.generate_fn = generate_fn
  ctx.interrupt = preempt.interrupt  # a stop within a rollout / evaluation

  # --- Data and resume --------------------------------------------------------
  prompts = (prompt_iterator or iterator.default)(cfg, train_examples)
  ckpt = checkpoint.Checkpointer(
    os.path.join(workdir, "checkpoints"),
    keep=cfg.keep_checkpoints,
    background=cfg.async_checkpoint,
  )
  closing.enter_context(ckpt)
  restored, meta = ckpt.restore(checkpoint.abstract(state))
  start, stopping = 0, False
  if restored is not None:
    state, start = restored, int(meta["step"])
    prompts.restore(meta["data"])
    evaluations.say(
      f"resuming {workdir} at step {start}/{cfg.steps} (its checkpoint)"
    )
  # Only the first step's rollout rows are of weights the run has.
  run_info.clear_rollout_journals(workdir, cfg, start)
  # A rerun of a finished run scores nothing again (its weights are those
  # eval_after.json scored).
  finished = None
  if not cfg.allow_config_change:  # else what it scored may have changed
    finished = run_info.finished_eval(workdir, start, scope)
  if is_main:  # running: neither finished nor stopped
    run_info.write_status(workdir, None)
  writer = metrics_lib.MetricWriter(
    workdir,
    # Rows after the checkpoint are redone: cut them (all, from step 0).
    keep_through=start if restored is not None else -1,
    enabled=is_main,
    tensorboard=cfg.tensorboard,
    wandb_project=cfg.wandb_project,
    config=dataclasses.asdict(cfg),
  )
  closing.enter_context(writer)
  rng = jax.random.key(cfg.seed)
  sampling = sampling_lib.Sampling(
    temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k
  )

  def rollout_of(examples, key, step):
    """The policy's samples of `examples`, as the loop samples a step."""
    return ctx.generate(
      ctx.params,
      examples,
      key,
      step,
      group_size=cfg.group_size,
      sampling=sampling,
      progress=context_lib.step_progress(
        step, cfg.steps, "rollout sequences", len(examples) * cfg.group_size
      ),
    )

  def sample_more(step, round_):
    # The prompts advance the checkpointed iterator; the key is a function
    # of (seed, step, round), so a resumed run draws the same samples.
    preempt.interrupt()  # a stop is not kept waiting for more rounds
    more = next(prompts)
    return rollout_of(more, jax.random.fold_in(rng, round_), step), more

  def save(step, wait=False, data=None):
    # In the background mode the write goes on during the next steps (a
    # stop's save is waited for: the process exits next). `data`: the
    # prompt iterator's state, if not its present one.
    t0 = time.time()
    meta = {"step": step, "data": prompts.state() if data is None else data}
    ckpt.save(step, state, meta, wait=wait)
    if (seconds := time.time() - t0) >= context_lib.PROGRESS_SECONDS:
      how = "copied to the host" if cfg.async_checkpoint else "saved"
      evaluations.say(f"checkpoint {step} {how} in {seconds:.0f} s")

  evals = evaluations.Evaluations(
    ctx, eval_examples, scope, workdir, writer, lambda: policy_of(state.params)
  )
  first_eval, stopping = evals.at_start(start, restored is not None)

  def sample(step):
    """The step's rollout, its examples and when it was ready."""
    examples = next(prompts)
    ctx.params = policy_of(state.params)  # merged once per step with LoRA
    rollout = rollout_of(examples, rng, step)
    jax.block_until_ready(rollout.mask)
    return rollout, examples, time.time()

  # --- The RL loop ------------------------------------------------------------
  progress = metrics_lib.Progress(cfg.steps, start)
  peak_flops = devices.peak_flops()  # None on a CPU: no "mfu/update"
  last, done = {}, start
  for step in range(start, cfg.steps):
    if step == start and (stopping := stopping or preempt.agreed()):
      break  # signalled before its first step: nothing new to save
    t0 = time.time()
    data = copy.deepcopy(prompts.state())  # the step's start
    # A stop while the step samples keeps the rows finished (rerun: the rest).
    ctx.rollout_journal = run_info.rollout_journal(workdir, cfg, step)
    try:
      rollout, examples, t1 = sample(step)
      ctx.extra = {k: state.params[k] for k in extra_keys}
      ctx.sample_more = functools.partial(sample_more, step)
      ctx.step = step
      ctx.take_nonfinite_rewards()
      batch, batch_metrics = make_batch(rollout, examples, ctx)
    except preemption.Interrupted:  # within the step's sampling
      stopping = True
      evaluations.say(
        f"step {step + 1}/{cfg.steps} stopped during its sampling; a rerun "
        "samples only what its journal does not hold"
      )
      if ckpt.latest_step() != step:
        save(step, wait=True, data=data)  # its weights are the step's start
      break
    run_info.remove_rollout_journal(ctx.rollout_journal)  # the batch holds it
    ctx.rollout_journal = None
    if bad_rewards := ctx.take_nonfinite_rewards():
      # NaN and inf rewards alike: the train step skips its update.
      batch = {**batch, "skip": np.ones(len(batch["mask"]), np.float32)}
      batch_metrics = {**batch_metrics, "reward_nonfinite": bad_rewards}
    ctx.params = ctx.extra = None  # `state` is donated by the updates below.
    t2 = time.time()
    said = context_lib.step_progress(
      step, cfg.steps, "updates", updates_per_step
    )
    state, update_metrics = ts.run_updates(
      step_fn,
      state,
      batch,
      batch_sh,
      epochs=cfg.ppo_epochs,
      minibatches=cfg.minibatches,
      rng=np.random.default_rng([cfg.seed, step]),
      progress=said,
    )
    if run.extra_step is not None:  # e.g. a critic's updates of its own
      policy_updates = len(update_metrics)
      state, extra_metrics = ts.run_updates(
        run.extra_step,
        state,
        batch,
        batch_sh,
        epochs=cfg.ppo_epochs,
        minibatches=run.extra_minibatches,
        rows=run.extra_rows,
        rng=np.random.default_rng([cfg.seed, step, 1]),
        progress=functools.partial(_after, said, policy_updates),
      )
      update_metrics += metrics_lib.own_update_metrics(
        extra_metrics, "+".join(extra_keys)
      )
    t3 = time.time()

    update_flops = None
    if peak_flops:  # a GPU or TPU: the policy's model FLOPs, all epochs
      n, width = batch["tokens"].shape
      flops = transformer.flops_per_token(model_cfg, width) * n * width
      flops *= cfg.ppo_epochs
      update_flops = (flops, peak_flops)
    row = metrics_lib.step_row(
      update_metrics, batch_metrics, rollout, (t0, t1, t2, t3), update_flops
    )
    last = writer.write(step + 1, row)
    if row["skipped"]:
      logging.warning(
        "Step %d: %d non-finite updates skipped", step + 1, row["skipped"]
      )
    if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
      progress.update(step + 1, last)
    unscored = False  # an evaluation a stop cut short: the rerun's first
    if (
      cfg.eval_every
      and (step + 1) % cfg.eval_every == 0
      and step + 1 < cfg.steps
    ):
      unscored = evals(step + 1) is None
    # Alike on every process:
    stopping, done = preempt.agreed() or unscored, step + 1
    if stopping or (
      cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0
    ):
      save(step + 1, wait=stopping)
    if stopping:
      break

  final = {}
  if not stopping:
    if ckpt.latest_step() != cfg.steps:
      save(cfg.steps)
    final, stopping = evals.at_end(start, first_eval, finished)
  writer.close()
  ckpt.close()
  if is_main:
    run_info.write_status(workdir, stopping, done, cfg.steps)
  return {
    **last,
    **final,
    "stopped": stopping,
    "step": done,
    "workdir": workdir,
    "state": state,
    "model_cfg": model_cfg,
  }


def train_and_report(
  cfg,
  *,
  name: str,
  title: str,
  make_batch: Callable,
  loss_fn: Callable,
  needs_ref: bool | None = None,
  **train_kwargs,
) -> dict[str, Any]:
  """An experiment's run(cfg): `train`, then report.md titled `title`.

  `needs_ref` defaults to cfg.needs_ref (False for configs without it);
  `train_kwargs` go to `train` (extra_params, prompt_iterator).
  """
  if needs_ref is None:
    needs_ref = getattr(cfg, "needs_ref", False)
  out = train(
    cfg,
    make_batch=make_batch,
    loss_fn=loss_fn,
    name=name,
    needs_ref=needs_ref,
    **train_kwargs,
  )
  path = report.write(out["workdir"], title=title)
  evaluations.say(f"report: {path}")
  return out


def _after(progress, before: int, done: int):
  """`progress` told of `done` updates after `before` others."""
  progress(before + done)


def warm_started(cfg, name: str, needs_ref: bool | None = None, **overrides):
  """sft.warm_started(cfg, **overrides) for an experiment that warm-starts
  on other data or lengths than the loop's: when a warm start is to run, the run
  `name`'s inputs are checked first (preflight.check_run), so a bad flag
  fails before minutes of SFT; otherwise `cfg` is returned as it is and
  train() checks them once."""
  if sft.will_warm_start(cfg):
    preflight.check_run(cfg, name, needs_ref)
  return sft.warm_started(cfg, **overrides)


def warm_started_on_episodes(cfg, name: str):
  """A multi-turn run's `cfg` from its SFT warm start (warm_started) on
  whole episodes: each demonstration (calls, tool outputs, answer) is cut
  at the episode's T tokens (multiturn.plan_config), not at
  --max_new_tokens, which a multi-turn run does not read (at its default
  64 the 2-hop kbqa demonstrations lost their answers)."""
  t = multiturn.plan_config(cfg).max_new_tokens
  return warm_started(cfg, name, max_new_tokens=t)
