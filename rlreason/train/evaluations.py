"""The RL loop's evaluations of its policy: before the first step
(eval_before.json), every --eval_every steps, and after the last
(eval_after.json). Each is resumable: a stop cuts it short after the chunk
under way and its journal keeps the problems scored for the rerun.

  evals = evaluations.Evaluations(ctx, examples, scope, workdir, writer,
                                  policy)
  first, stopped = evals.at_start(start, resumed)  # before, or a missed one
  out = evals(step)                                # None if a stop came first
  final, stopped = evals.at_end(start, first, finished)

`policy()` gives the weights to score as they are when called (the loop's
present state; LoRA's merged only when an evaluation runs).
"""

import sys
import time
from typing import Any, Callable

import jax
from etils import epath

from rlreason import storage
from rlreason.train import context as context_lib
from rlreason.train import preemption
from rlreason.train import preflight
from rlreason.train import report
from rlreason.train import run_info


def say(line: str) -> None:
  """A line on stderr from process 0 (the others keep quiet)."""
  if jax.process_index() == 0:
    print(line, file=sys.stderr, flush=True)


def scope(cfg, train_examples, eval_examples) -> dict[str, Any]:
  """What eval_before / eval_after.json and the eval lines say of the
  problems scored: how many, how many of them are training problems, and
  the samples per problem."""
  return {
    "problems": len(eval_examples),
    "trained_on": preflight.trained_on(cfg, train_examples, eval_examples),
    "samples": cfg.eval_samples,
  }


class Evaluations:
  """The evaluations of one run (module docstring)."""

  def __init__(
    self,
    ctx: context_lib.Context,
    examples,
    scope: dict[str, Any],
    workdir: str,
    writer,
    policy: Callable[[], Any],
  ):
    self.ctx, self.examples, self.scope = ctx, examples, scope
    self.workdir, self.writer, self.policy = workdir, writer, policy
    self.cfg = ctx.cfg
    self.is_main = jax.process_index() == 0

  def __call__(self, step: int) -> dict[str, float] | None:
    """The evaluation's metrics (also written to the metrics at `step`), or
    None where a stop came first."""
    cfg, t0 = self.cfg, time.time()
    # Interrupted, it resumes after the problems its journal holds.
    journal = run_info.eval_journal(self.workdir, cfg, step)
    try:
      out = context_lib.run_eval(
        self.ctx,
        self.policy(),
        self.examples,
        step=step,
        samples=cfg.eval_samples,
        temperature=cfg.temperature,
        ks=sorted({1, cfg.eval_samples}),
        journal=journal,
      )
    except preemption.Interrupted:
      say(
        f"eval at step {step}/{cfg.steps} stopped after "
        f"{time.time() - t0:.1f} s; a rerun resumes it from its journal"
      )
      return None
    if self.is_main:  # its numbers are in the metrics now
      run_info.remove_journal(journal)
    self.writer.write(step, out)
    say(
      f"eval at step {step}/{cfg.steps} | "
      f"{report.eval_line({**out, **self.scope})} | {time.time() - t0:.1f} s"
    )
    return out

  def at_start(self, start: int, resumed: bool) -> tuple[dict | None, bool]:
    """(the first evaluation's metrics, whether a stop cut it short): a new
    run scores its initial weights (eval_before.json); a resumed one the
    evaluation --eval_every scheduled at its checkpoint's step that its
    metrics lack (one a stop cut short), else none."""
    if start == 0 and not resumed:
      first = self(0)
      if self.is_main and first is not None:
        self._write("eval_before.json", first)
      return first, first is None
    if run_info.evaluation_missing(self.workdir, self.cfg, start):
      return None, self(start) is None
    return None, False

  def at_end(
    self, start: int, first: dict | None, finished: dict | None
  ) -> tuple[dict, bool]:
    """(the final evaluation's metrics, whether a stop cut it short), also
    in eval_after.json. Scores nothing again where the weights were scored:
    a run of 0 steps (`first`'s) or the rerun of a finished run
    (`finished`: run_info.finished_eval's)."""
    steps = self.cfg.steps
    if steps == 0 and first is not None:
      final = first  # no step: the weights it scored
    elif start == steps and finished:
      final = finished
      say(
        f"eval at step {start}/{steps} | {report.eval_line(final)} | "
        "the finished run's (eval_after.json)"
      )
    else:
      final = self(steps)
      if final is None:
        return {}, True
    if self.is_main:
      self._write("eval_after.json", final)
    return final, False

  def _write(self, name: str, metrics: dict) -> None:
    storage.write_json(
      epath.Path(self.workdir) / name, {**metrics, **self.scope}
    )
