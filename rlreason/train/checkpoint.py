"""Orbax checkpoints of a run: TrainState + the host-side position.

  ckpt = Checkpointer(workdir + "/checkpoints", keep=2)
  ckpt.save(step, state, meta={"data": data_state, "seed": seed})
  state, meta = ckpt.restore(abstract_state)  # latest, or (None, None)

Orbax writes into a temporary directory and renames it when complete, so an
interrupted save never leaves a half checkpoint behind. `meta` is JSON
(the data iterator position, RNG seed, anything the loop needs to continue
exactly). A state holding a non-finite value is refused: a checkpoint never
contains NaN.

With `background=True` (runs: --async_checkpoint) `save` returns once the
state is copied to host memory and orbax writes it while training goes on;
the next save, `latest_step`, `wait` and `close` wait for that write first,
and a write that failed raises CheckpointError there, naming its step. A
process killed mid-write leaves only orbax's temporary directory, which a
restore ignores.

A save that fails (disk full, no permission) raises CheckpointError naming
the directory and the cause; the checkpoints before it are untouched. A
latest checkpoint that cannot be restored (a truncated array file, missing
metadata) is moved aside to `<directory>.corrupt/` (never deleted) and the
next older one is restored instead, with a warning saying so.

`Resumable` makes work outside the RL loop (a warm start, pretraining, a
reward model's training) stop on SIGTERM / Ctrl-C with a checkpoint
(preemption.Preemption) and resume.
"""

import contextlib
import logging as std_logging
import os
import shutil
import sys
import threading
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging

from rlreason import storage
from rlreason.train import preemption


class CheckpointError(RuntimeError):
  """A checkpoint could not be written; the message names path and cause."""


class Stopped(Exception):
  """A signal stopped work that was checkpointed (e.g. the warm start);
  rerunning the same command resumes it."""

  def __init__(self, what: str, step: int, steps: int):
    super().__init__(f"{what} stopped at step {step} of {steps}")
    self.what, self.step, self.steps = what, step, steps


class Checkpointer:
  """Keep-last-N orbax checkpoints in `directory` (local path or gs://)."""

  def __init__(self, directory: str, keep: int = 2, background: bool = False):
    if keep < 1:
      raise ValueError(f"keep={keep}: at least one checkpoint must be kept")
    # Orbax resolves URLs (gs://) itself; a local path must be absolute.
    directory = os.fspath(directory)
    if storage.is_local(directory):
      directory = os.path.abspath(directory)
    self.directory = directory
    self._keep = keep
    self._background = background
    self._pending = None  # the step being written in the background
    self._manager = self._open()

  def _open(self):
    return ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=self._keep,
        create=True,
        enable_async_checkpointing=self._background,
      ),
      item_names=("state", "meta"),
    )

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step (after any write in flight)."""
    self.wait()
    return self._manager.latest_step()

  def save(self, step: int, state, meta: dict, wait: bool = False) -> None:
    """Saves `state` and `meta`; every process must call it (multi-host).

    In the background mode it returns once `state` is on the host (the
    caller may then donate it) unless `wait`.
    """
    if not bool(_all_finite(state)):
      raise ValueError(
        f"Refusing to checkpoint step {step}: the state holds non-finite values"
      )
    self.wait()  # the previous write, whose failure names its own step
    _quiet_orbax_failures()
    self._pending = step
    with self._failure(step):
      self._manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
        ),
        force=True,
      )
    if wait or not self._background:
      self.wait()

  def wait(self) -> None:
    """Until the write in flight (if any) is complete; CheckpointError if it
    failed."""
    if self._pending is None:
      return
    step, self._pending = self._pending, None
    with self._failure(step):
      self._manager.wait_until_finished()
    logging.info("Saved checkpoint %d to %s", step, self.directory)

  @contextlib.contextmanager
  def _failure(self, step: int):
    """Any error inside -> CheckpointError naming step, path and cause."""
    try:
      yield
    except Exception as e:  # noqa: BLE001 - orbax wraps OSErrors variously
      self._pending = None
      cause = _root_cause(e)
      raise CheckpointError(
        f"Could not write checkpoint {step} to {self.directory}: "
        f"{type(cause).__name__}: {cause}. The checkpoints before it are "
        "intact; free the space (or fix the permission) and rerun the same "
        "command to resume."
      ) from e

  def restore(self, abstract_state, step: int | None = None):
    """(state, meta) at `step` (default latest), or (None, None) if none.

    `abstract_state` is a pytree of jax.ShapeDtypeStruct with shardings: the
    arrays come back directly in that layout. Without `step`, a checkpoint
    that fails to restore is moved aside and the next older one is tried.
    """
    self.wait()
    if step is not None:
      return self._restore(abstract_state, step)
    while (step := self.latest_step()) is not None:
      try:
        return self._restore(abstract_state, step)
      except Exception as e:  # noqa: BLE001 - orbax / TensorStore errors
        cause = _root_cause(e)
        moved = self._move_aside(step)
        older = self.latest_step()
        logging.warning(
          "Checkpoint %d in %s could not be restored (%s: %s); moved it to "
          "%s. %s",
          step,
          self.directory,
          type(cause).__name__,
          str(cause).splitlines()[0] if str(cause) else "",
          moved,
          f"Resuming from checkpoint {older}."
          if older is not None
          else "No older checkpoint: starting from step 0.",
        )
    return None, None

  def _restore(self, abstract_state, step: int):
    out = self._manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        meta=ocp.args.JsonRestore(),
      ),
    )
    logging.info("Restored checkpoint %d from %s", step, self.directory)
    return out.state, out.meta

  def _move_aside(self, step: int) -> str:
    """Moves step's directory to <directory>.corrupt/<step>-<time>."""
    src = os.path.join(self.directory, str(step))
    dst = os.path.join(
      self.directory.rstrip("/") + ".corrupt",
      f"{step}-{time.strftime('%Y%m%d-%H%M%S')}",
    )
    if jax.process_index() == 0:
      if storage.is_local(src):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.move(src, dst)
      else:
        from etils import epath

        epath.Path(dst).parent.mkdir(parents=True, exist_ok=True)
        epath.Path(src).rename(dst)
    self._manager.close()
    self._manager = self._open()
    return dst

  def close(self):
    """Waits for the write in flight (CheckpointError if it failed); again
    is a no-op."""
    if self._manager is None:
      return
    try:
      self.wait()
    finally:
      self._manager.close()
      self._manager = None

  def __enter__(self):
    return self

  def __exit__(self, kind, error, traceback):
    """`close`; where an error is under way, the write in flight is still
    finished (a process that exits with one in flight loses it, and orbax
    holds the exit for minutes: measured 5 min), and its failure is logged
    rather than raised over that error."""
    if kind is None:
      return self.close()
    if self._pending is not None:
      print(
        f"finishing checkpoint {self._pending}'s write before stopping",
        file=sys.stderr,
        flush=True,
      )
    try:
      self.close()
    except CheckpointError as e:
      logging.error("%s", e)


_QUIET = []


def _quiet_orbax_failures() -> None:
  """Once per process: orbax's writer threads re-raise a failed write (disk
  full) in every thread and log it with a traceback, dozens of times; the
  save's CheckpointError (or a restore's warning) says it once. Exceptions
  of orbax's threads go to the absl log at DEBUG, and orbax's own ERROR log
  lines are dropped; every other thread and logger is untouched."""
  if _QUIET:
    return
  _QUIET.append(True)
  previous = threading.excepthook

  def hook(args):
    tb = args.exc_traceback
    while tb is not None and tb.tb_next is not None:
      tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename if tb is not None else ""
    frames = []
    t = args.exc_traceback
    while t is not None:
      frames.append(t.tb_frame.f_code.co_filename)
      t = t.tb_next
    if any("orbax" in f for f in frames) or "asyncio" in where:
      logging.debug("orbax thread: %s: %s", args.exc_type, args.exc_value)
      return
    previous(args)

  threading.excepthook = hook

  class _DropOrbaxErrors(std_logging.Filter):
    def filter(self, record):
      return not (
        "orbax" in record.pathname and record.levelno >= std_logging.ERROR
      )

  std_logging.getLogger("absl").addFilter(_DropOrbaxErrors())


def _root_cause(e: BaseException) -> BaseException:
  """The innermost exception of a chain (orbax wraps the OSError)."""
  seen = set()
  while id(e) not in seen and (e.__cause__ or e.__context__):
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return e


@jax.jit
def _all_finite(tree) -> jax.Array:
  """True iff every floating-point leaf is finite, in one program.

  A check per leaf would dispatch a burst of small cross-device reductions,
  which deadlocked XLA:CPU collectives (4 simulated devices, JAX 0.10).
  """
  ok = [
    jnp.isfinite(x).all()
    for x in jax.tree.leaves(tree)
    if jnp.issubdtype(x.dtype, jnp.floating)
  ]
  return jnp.stack(ok).all() if ok else jnp.asarray(True)


def abstract(tree):
  """Arrays -> ShapeDtypeStructs with their shardings (restore targets)."""
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=getattr(x, "sharding", None)
    ),
    tree,
  )


# A Resumable's work is also saved this often (seconds), in the background:
# a process killed without a signal (the OOM killer, a closed laptop, a
# crash) resumes from there rather than from its start.
SAVE_SECONDS = 600.0


class Resumable:
  """Work outside the RL loop that SIGTERM or Ctrl-C stops resumably (a
  warm start, pretraining, a reward model's training): `restore` what a
  stopped (or killed) call saved, `maybe_stop` after each step
  (checkpoints and raises Stopped once a signal came; saves every
  `every` seconds, SAVE_SECONDS by default), `close` at the end (or use
  it as a context manager: its signal handlers go however the work ends).
  Handed to lower layers (rewards/) that cannot import this one."""

  def __init__(self, directory: str, label: str, every: float | None = None):
    self.directory, self.label = directory, label
    self.every = SAVE_SECONDS if every is None else every
    self._ckpt = Checkpointer(directory, keep=1, background=True)
    self._preempt = preemption.Preemption()
    self._saved = time.time()

  def restore(self, tree):
    """(tree, meta) as saved, in `tree`'s layout, or (None, None)."""
    return self._ckpt.restore(abstract(tree))

  def maybe_stop(self, step: int, steps: int, tree, meta) -> None:
    """After step `step` of `steps`: once SIGTERM or Ctrl-C came (to any
    process), saves `tree` and meta() (JSON) and raises Stopped; else,
    `every` seconds after the last save, saves them in the background and
    goes on. Every process must call it alike."""
    due = time.time() - self._saved >= self.every
    stop, due = preemption.any_process(self._preempt.requested, due)
    if step >= steps:
      return
    if stop or due:
      self._ckpt.save(step, tree, {**meta(), "step": step}, wait=stop)
      self._saved = time.time()
    if stop:
      self.close()
      raise Stopped(f"{self.label} (in {self.directory})", step, steps)

  def close(self) -> None:
    """Restores the signal handlers and finishes the write in flight (once;
    again is a no-op)."""
    self.__exit__(None, None, None)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    """`close`, the Checkpointer's way (Checkpointer.__exit__)."""
    if self._ckpt is None:
      return
    self._preempt.restore_handlers()
    ckpt, self._ckpt = self._ckpt, None
    ckpt.__exit__(*exc)
