"""A frozen teacher model beside the policy (distillation, guidance).

KDRL (arXiv:2506.02208) adds a reverse KL to a teacher on the student's
own samples; AMPO (arXiv:2510.02227) and LUFFY mix a teacher's solutions
into groups. `Teacher` loads one lazily, on the run's mesh, the first time
make_batch asks for it, and serves

  teacher.logp(ctx, rollout)             [N, T] log-probs of the rollout's
                                         completions under the teacher
  teacher.generate(ctx, examples, ...)   the teacher's own samples

Specs (`--teacher`):
  "warm_start"   the task's SFT warm start on EXACT solutions (noise 0) for
                 `steps` steps: at laptop scale a stronger model than the
                 noisy-warm-started student, cached like every warm start;
  a directory    a Hugging Face checkpoint (e.g. a larger model of the
                 same family) or an rlreason workdir (trained.load);
  a preset name  random weights (tests only).
The teacher must share the policy's tokenizer (the losses compare
log-probs of the same token ids).
"""

import dataclasses

from rlreason.sampling import draw as sampling_lib


def check(spec: str, steps: int, warm_start_steps: int) -> None:
  """A teacher spec's usage errors, for an experiment's validate() (before
  any compute): the "warm_start" teacher with no SFT steps (`steps` and the
  policy's `warm_start_steps` both 0, as on the shipped base) is the
  untrained model, the policy's own start, not a stronger model."""
  if spec == "warm_start" and not (steps or warm_start_steps):
    raise ValueError(
      "Invalid config: --teacher=warm_start with 0 SFT steps "
      "(--teacher_steps=0 and --warm_start_steps=0) is the policy's own "
      "starting model; give it --teacher_steps > 0 or name a checkpoint"
    )


class Teacher:
  """A lazily loaded frozen model.

  Args:
    spec: see the module doc.
    steps: warm-start steps of the "warm_start" teacher (0: the policy's
      warm_start_steps).
  """

  def __init__(self, spec: str, *, steps: int = 0):
    if not spec:
      raise ValueError("a teacher needs a spec (--teacher)")
    self.spec, self.steps = spec, steps
    self.model_cfg = self.params = None

  def load(self, ctx):
    """(model_cfg, params) on ctx.mesh, loaded once."""
    if self.params is None:
      self.model_cfg, self.params = _load(self.spec, ctx.cfg, ctx.mesh, self)
      if self.model_cfg.vocab_size < ctx.tokenizer.vocab_size:
        raise ValueError(
          f"teacher {self.spec!r} has {self.model_cfg.vocab_size} token "
          f"ids, the tokenizer {ctx.tokenizer.vocab_size}"
        )
    return self.model_cfg, self.params

  def logp(self, ctx, rollout, *, tokens=None, positions=None):
    """[N, T] teacher log-probs of the completions (host numpy), scored as
    the loop scores the reference (Context.completion_scores: one train
    micro-batch of rows per forward, activations split by batch on the
    run's mesh; the planner's `teacher` program).

    tokens / positions [N, P + T] default to the rollout's (pass a
    rebased context, e.g. hints.unhinted_batch's, to score it instead).
    """
    model_cfg, params = self.load(ctx)
    tokens = rollout.tokens if tokens is None else tokens
    positions = rollout.positions if positions is None else positions
    prompt_len = tokens.shape[1] - rollout.mask.shape[1]
    return ctx.completion_scores(
      params, tokens, positions, prompt_len, model_cfg=model_cfg
    )

  def generate(self, ctx, examples, rng, *, group_size: int):
    """The teacher's samples for `examples` (a types.Rollout), by its own
    architecture (it may be another size or family than the policy's)."""
    model_cfg, params = self.load(ctx)
    cfg = ctx.cfg
    return ctx.generate(
      params,
      list(examples),
      rng,
      ctx.step,
      group_size=group_size,
      sampling=sampling_lib.Sampling(
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k
      ),
      model_cfg=model_cfg,
    )


def _load(spec: str, cfg, mesh, teacher):
  # Deferred imports: sft and trained import the loop, which imports this
  # module's siblings.
  from rlreason.train import sft
  from rlreason.eval import trained

  if spec == "warm_start":
    base = dataclasses.replace(
      cfg,
      init_from="",
      warm_start_noise=0.0,
      warm_start_steps=teacher.steps or cfg.warm_start_steps,
    )
    spec = sft.warm_start(base)
  # Frozen, so kept in the compute dtype as the loop keeps the reference
  # (half the bytes of float32 weights in bf16 runs).
  pol = trained.load(
    spec, mesh=mesh, seed=cfg.seed, dtype=cfg.dtype, param_dtype=cfg.dtype
  )
  return pol.model_cfg, pol.params
