"""What an RL run's host code works with: Context and its evaluation.

  ctx = context.Context(cfg, model_cfg, tokenizer, mesh, reward_fn, correct_fn)
  accuracy = context.run_eval(ctx, params, examples, step=0)

`Context` is what an experiment's make_batch and the evaluations receive
(generate, score, batch_from_rollout, ref_logp, hooks the loop sets per
step); loaders.py builds its model, tokenizer and reward functions from a
Config's --model / --init_from / --tokenizer / --reward / --data.
"""

import contextlib
import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from rlreason import devices
from rlreason.data import sources as data_lib
from rlreason.sampling import scoring as evaluation
from rlreason.guidance import hints
from rlreason import mesh as mesh_lib
from rlreason import metrics as metrics_lib
from rlreason.model import policy
from rlreason.sampling import rollout as rollout_lib
from rlreason.sampling import rollout_layout
from rlreason.model import transformer
from rlreason.train import train_step as ts
from rlreason.types import Rollout


@dataclasses.dataclass
class Context:
  """What make_batch and evaluation need, built once per run."""

  cfg: Any
  model_cfg: transformer.ModelConfig
  tokenizer: Any
  mesh: jax.sharding.Mesh
  reward_fn: Callable  # (completions, answers, **kw) -> (total [N], parts)
  correct_fn: Callable  # (completions, answers) -> 0/1 [N]
  ref_params: Any = None
  params: Any = None  # the policy that sampled the current rollout
  # (round) -> (rollout, examples): the next B prompts of the run's prompt
  # iterator, sampled by `params` with a key of (seed, step, round). Set by
  # the loop during make_batch, for methods that sample more than one batch
  # per step (DAPO dynamic sampling, rlreason/rl/dynamic_sampling.py).
  sample_more: Callable | None = None
  # Parameters trained beside the policy (train(..., extra_params=...)),
  # e.g. {"critic": ...} (value.py), as of the current rollout.
  extra: dict | None = None
  # The RL step being built (0-based), set by the loop before make_batch,
  # for reward schedules (e.g. experiments/format_length.py).
  step: int = 0
  # (ctx, params, examples, rng, step, *, group_size, sampling) -> rollout:
  # replaces the single-turn sampler for training and evaluation (e.g.
  # multiturn.make_generate_fn: environment episodes).
  generate_fn: Callable | None = None
  # () -> None, called between the parts of long sampling (sampler calls,
  # evaluation chunks, multi-turn turns, tree calls; every process at the
  # same points); it raises to abandon the work there. The loop's is
  # preemption.Preemption.interrupt: a stop does not wait for a rollout or
  # an evaluation to end.
  interrupt: Callable[[], None] | None = None
  # A local directory where the single-turn sampler keeps the rows a
  # rollout of `params` finished (rollout.generate's journal), set by the
  # loop while a step samples (run_info.rollout_journal): a stopped step's
  # rerun samples only the rest.
  rollout_journal: str | None = None

  def encode_prompts(self, examples) -> list[list[int]]:
    cfg = self.cfg
    cut = cfg.max_prompt_len if getattr(cfg, "truncate_prompts", 0) else None
    return prompt_ids(self.tokenizer, examples, cfg.template, max_len=cut)

  def generate(
    self,
    params,
    examples,
    rng,
    step,
    *,
    group_size,
    sampling,
    max_new_tokens: int | None = None,
    row_offset: int = 0,
    model_cfg: transformer.ModelConfig | None = None,
    progress: Callable[[int], None] | None = None,
  ) -> Rollout:
    """G samples per example; max_new_tokens overrides cfg.max_new_tokens
    on the single-turn path (a custom generate_fn sets its own budget).

    row_offset: the global index of the first row when a batch is sampled
    in chunks. Single-turn rows then sample as in one call
    (rollout.generate); a custom generate_fn gets a key folded with it, so
    chunks draw independently (but not as one call would).

    model_cfg: the architecture of `params` where they are another model's
    than the policy's (a teacher's), sampled as the run samples
    (sampled_as); single-turn only.

    progress: called with the rows sampled so far during a long rollout
    (rollout.generate; a custom generate_fn gets it as `progress`: the
    episodes finished after each turn, multiturn.py, or the trees' rows
    after each sampler call, tree_loop.py). `self.interrupt` may stop it
    between those parts (a custom generate_fn calls it itself); the
    single-turn sampler then keeps the rows it finished in
    `self.rollout_journal`, where set, for the rerun."""
    other = model_cfg is not None and model_cfg != self.model_cfg
    if other and self.generate_fn is not None:
      raise ValueError(
        "another model's samples (a teacher's) take the single-turn "
        "sampler; this run replaces it (generate_fn)"
      )
    if self.generate_fn is not None:
      return self.generate_fn(
        self,
        params,
        examples,
        jax.random.fold_in(rng, row_offset) if row_offset else rng,
        step,
        group_size=group_size,
        sampling=sampling,
        progress=progress,
      )
    return rollout_lib.generate(
      params,
      self.encode_prompts(examples),
      rng,
      step,
      model_cfg=self.sampled_as(model_cfg or self.model_cfg),
      tokenizer=self.tokenizer,
      max_new_tokens=max_new_tokens or self.cfg.max_new_tokens,
      group_size=group_size,
      sampling=sampling,
      max_prompt_len=self.cfg.max_prompt_len,
      row_offset=row_offset,
      progress=progress,
      interrupt=self.interrupt,
      # The policy's rollouts only: the journal is its weights' own.
      journal=self.rollout_journal if params is self.params else None,
      **self.sampler_kwargs(),
    )

  def sampler_kwargs(self) -> dict:
    """How the run samples (rollout.generate's keywords): on its mesh, in
    calls of --rollout_rows (0: sized from free memory), --rollout_batching,
    under --rollout_temp_budget_mib. The policy's rollouts and other models'
    sampling in the run (rm_grpo's generative judge) share them."""
    return dict(
      mesh=self.mesh,
      rows_per_call=getattr(self.cfg, "rollout_rows", 0),
      batching=getattr(self.cfg, "rollout_batching", "static"),
      compiler_options=ts.compiler_options(
        getattr(self.cfg, "rollout_temp_budget_mib", 0), self.mesh
      ),
    )

  @property
  def rollout_model_cfg(self):
    """The single-turn sampler's architecture: the policy's, sampled_as."""
    return self.sampled_as(self.model_cfg)

  @property
  def segments_model_cfg(self):
    """The multi-turn and tree samplers' architecture (sampling/segments.py):
    rollout_model_cfg (--rollout_dtype, --rollout_layout,
    --rollout_tensor) with the model's own decode attention, the one their
    segments take (dense)."""
    return dataclasses.replace(
      self.rollout_model_cfg, decode_attention=self.model_cfg.decode_attention
    )

  def sampled_as(self, model_cfg):
    """`model_cfg` as the run's single-turn sampler runs it
    (rollout_layout.sampled_as: --rollout_dtype, --decode_attention,
    --rollout_layout, --rollout_tensor on the run's mesh)."""
    return rollout_layout.sampled_as(self.cfg, model_cfg, self.mesh)

  @property
  def score_rows(self) -> int:
    return ts.score_rows(self.cfg, self.mesh)

  @contextlib.contextmanager
  def scoring(self):
    """Where the whole-rollout forwards run: activations split by batch on
    the run's mesh (mesh.activation_mesh), as the train step's, and their
    programs compiled under --score_temp_budget_mib (libtpu's bound on
    their temporaries, devices.compile_options; TPU only)."""
    options = ts.compiler_options(
      getattr(self.cfg, "score_temp_budget_mib", 0), self.mesh
    )
    with mesh_lib.activation_mesh(self.mesh), devices.compile_options(options):
      yield

  def take_nonfinite_rewards(self) -> int:
    """Non-finite rewards seen since the last call (FiniteRewards)."""
    n = getattr(self.reward_fn, "nonfinite", 0)
    if n:
      self.reward_fn.nonfinite = 0
    return n

  def score(self, rollout: Rollout, examples) -> tuple[np.ndarray, dict]:
    """Rewards [N] and per-component metrics, answers repeated per group."""
    answers = [examples[i].answer for i in rollout.prompt_ids]
    total, parts = self.reward_fn(rollout.texts, answers)
    return total, parts

  def batch_from_rollout(self, rollout: Rollout) -> dict[str, np.ndarray]:
    """The [N, ...] fields every loss reads, on the host.

    old_logp is the sampler's log-prob when it sampled from softmax(logits /
    temperature) itself; with top-k / top-p filters the sampling distribution
    differs from the one the losses score, so old_logp is recomputed under
    the sampling policy (`sampler_logp` keeps the filtered one, for
    truncated importance sampling).
    """
    tokens, positions, mask, logp = mesh_lib.to_host(
      (rollout.tokens, rollout.positions, rollout.mask, rollout.logp)
    )
    batch = {
      "tokens": tokens,
      "positions": positions,
      "mask": mask.astype(np.float32),
      "sampler_logp": logp.astype(np.float32),
    }
    batch["old_logp"] = batch["sampler_logp"]
    if self.cfg.top_p < 1 or self.cfg.top_k > 0:
      batch["old_logp"] = self.trainer_logp(rollout)
    return batch

  def trainer_logp(self, rollout: Rollout) -> np.ndarray:
    """[N, T] log-probs of the completions under the current params as the
    trainer computes them (its dtype and layout, softmax(logits /
    temperature)), one train micro-batch of rows at a time."""
    return self._logp(self.params, rollout)

  def ref_logp(self, rollout: Rollout) -> np.ndarray:
    """log-probs [N, T] of the completions under the frozen reference."""
    if self.ref_params is None:
      raise ValueError(
        "This experiment needs a reference model, but the "
        "loop was started without one (needs_ref=True)"
      )
    return self._logp(self.ref_params, rollout)

  def per_token(self, rollout: Rollout, fns: tuple) -> tuple[np.ndarray, ...]:
    """[N, T] of each policy.completion_logprobs `per_token` function of
    the scored logits under the current params (e.g. entropy_reg's nucleus
    entropy, min-p proxy), one train micro-batch of rows at a time. `fns`
    are called outside a jit: the same objects each call (entropy_reg's
    *_fn constructors cache theirs), or each call compiles anew."""
    return self._logp(self.params, rollout, tuple(fns))[1:]

  def _logp(self, params, rollout: Rollout, per_token=()):
    return self.completion_scores(
      params,
      rollout.tokens,
      rollout.positions,
      rollout.prompt_len,
      per_token=per_token,
    )

  def completion_scores(
    self,
    params,
    tokens,
    positions,
    prompt_len,
    temperature=None,
    model_cfg=None,
    **kw,
  ):
    """policy.completion_logprobs (its `with_entropy` / `per_token` in `kw`)
    of a whole batch on the host: one train micro-batch of rows per forward
    (score_rows), at `temperature` (None: cfg.temperature), under
    `scoring` (activations split by batch on the run's mesh as the train
    step's are, the --score_temp_budget_mib; what the planner's ref_logp
    program compiles). The whole-rollout forwards of
    the loop and of make_batch functions run here, or as here with the
    mesh passed (self_scoring's, value.completion_values_by_rows under the
    activation mesh). `model_cfg` (default: the policy's) is the scoring
    model's (a teacher's, eval/teacher.py)."""
    with self.scoring():
      return mesh_lib.to_host(
        policy.completion_logprobs_by_rows(
          params,
          tokens,
          positions,
          model_cfg or self.model_cfg,
          prompt_len,
          rows=self.score_rows,
          temperature=self.cfg.temperature
          if temperature is None
          else temperature,
          **kw,
        )
      )


# A step's rollout or updates that run longer print how far they are at
# most this often.
PROGRESS_SECONDS = 30.0


def step_progress(
  step: int, steps: int, what: str, total: int
) -> Callable[[int], None]:
  """The loop's progress callback for step `step`'s `total` `what`
  (rollout sequences: Context.generate's `progress`; updates): a line when
  due (at paper scale each part runs for minutes). Every process gets one,
  so all split the sampler's loop alike; the first prints."""
  progress = metrics_lib.Progress(
    total, label=f"step {step + 1}/{steps}: {what}", every=PROGRESS_SECONDS
  )
  return progress.maybe if jax.process_index() == 0 else lambda done: None


def prompt_ids(tokenizer, examples, template: str, *, max_len: int | None):
  """Token ids of each example's prompt as the sampler sees it (a hinted
  example, hints.with_hint, shows its hint and prefix); with `max_len`,
  cut to the last max_len tokens (--truncate_prompts: the question's end
  and the template's cue to answer are kept)."""
  out = []
  for e in examples:
    ids = tokenizer.encode(hints.prompt_text(tokenizer, e, template))
    out.append(ids[-max_len:] if max_len and len(ids) > max_len else ids)
  return out


def eval_spec(cfg) -> str:
  """--eval_data, or the held-out split of --data (eval_size problems)."""
  if cfg.eval_data:
    return cfg.eval_data
  kind, _, options = data_lib.parse_spec(cfg.data)
  if kind != "task":
    return cfg.data
  # Later options win: ask the generator for eval_size problems only.
  return f"{cfg.data}{',' if options else ':'}n={cfg.eval_size}"


def run_eval(
  ctx: Context,
  params,
  examples,
  *,
  step: int,
  samples: int = 1,
  temperature: float = 1.0,
  ks=(1,),
  journal: str | None = None,
) -> dict[str, float]:
  """Greedy (samples=1) or sampled accuracy on `examples`, as flat floats;
  `journal` keeps the finished problems (scoring.sample_and_score)."""
  correct = evaluation.sample_and_score(
    ctx,
    params,
    examples,
    step=step,
    samples=samples,
    temperature=temperature,
    seed=ctx.cfg.seed,
    sequences_per_call=ctx.cfg.num_sequences,
    journal=journal,
  ).correct
  summary = evaluation.summarize(correct, ks=[k for k in ks if k <= samples])
  out = {}
  for name, (m, lo, hi) in summary.items():
    out[f"eval/{name}"], out[f"eval/{name}_lo"], out[f"eval/{name}_hi"] = (
      m,
      lo,
      hi,
    )
  out["eval/accuracy"] = float(correct.mean())
  return out
