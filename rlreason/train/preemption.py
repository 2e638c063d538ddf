"""Stops on request: SIGTERM (TPU maintenance, SLURM's time limit), Ctrl-C
or a time limit, agreed over the processes so that all of them stop at
the same point.

  with preemption.Preemption() as preempt:
    ...
    if preempt.agreed():      # between steps: checkpoint, then stop
      ...
    ctx.interrupt = preempt.interrupt  # within long work: raises Interrupted

The loop (rlreason/train/loop.py) and experiments.evaluate use it;
checkpoint.Resumable wraps one for work outside the loop.
"""

import signal
import sys
import threading
import time

import jax
import numpy as np


def after_hours(hours: float, flag: str = "--stop_after_hours"):
  """A Preemption's deadline `hours` from now, named by `flag`; None for 0
  (no limit)."""
  if not hours:
    return None
  return (time.time() + 3600 * hours, f"{flag}={hours:g}")


class Interrupted(BaseException):
  """Preemption.interrupt's: a stop was agreed while long work ran (a
  rollout's sampler calls, an evaluation's chunks); the part under way is
  dropped and the caller checkpoints what it holds. A BaseException, as
  KeyboardInterrupt: no `except Exception` on the way swallows it."""


def any_process(*flags: bool) -> tuple[bool, ...]:
  """Each flag OR-ed over the processes: the same answer on every one (a
  small all-gather where there are several; each must call it alike)."""
  if jax.process_count() == 1:
    return tuple(bool(f) for f in flags)
  from jax.experimental import multihost_utils

  mine = np.asarray(flags, np.int32)
  every = np.asarray(multihost_utils.process_allgather(mine))
  return tuple(bool(f) for f in every.reshape(-1, len(flags)).any(axis=0))


# What the signal handlers of the Preemptions alive in this process share:
# a run's warm start (a Resumable inside it) stops on a signal that came
# while the run was loading, or once the run's time limit passed
# ("deadline": (time.time() then, the flag that set it)).
_SIGNALLED = {"alive": 0, "requested": False, "deadline": None}


class Preemption:
  """SIGTERM (TPU maintenance, SLURM's time limit) and Ctrl-C as a flag the
  loop polls between steps, to checkpoint and stop, and long work between
  its parts (`interrupt`); a second Ctrl-C raises KeyboardInterrupt at
  once. Handlers are installed from the main thread only; use it as a
  context manager (or call restore_handlers)."""

  # What the first signal's line says is done next.
  STOPPING = (
    "checkpointing and stopping at the next sampler call, evaluation "
    "chunk or step end"
  )

  def __init__(
    self,
    signals=(signal.SIGTERM, signal.SIGINT),
    stopping: str = STOPPING,
    deadline: tuple[float, str] | None = None,
  ):
    """`deadline`: (time.time() at which a stop is requested as by a
    signal, what set it, e.g. "--stop_after_hours=11.5"), for this
    Preemption and those nested in it."""
    self._stopping = stopping
    if not _SIGNALLED["alive"]:  # a new run: no old signal or limit
      _SIGNALLED.update(requested=False, deadline=None)
    if deadline is not None:
      _SIGNALLED["deadline"] = deadline
    _SIGNALLED["alive"] += 1
    self._previous, self._alive = {}, True
    if threading.current_thread() is threading.main_thread():
      for sig in signals:
        self._previous[sig] = signal.signal(sig, self._handle)

  @property
  def requested(self) -> bool:
    deadline = _SIGNALLED["deadline"]
    if not _SIGNALLED["requested"] and deadline and time.time() >= deadline[0]:
      _SIGNALLED["requested"] = True
      print(f"{deadline[1]} reached: {self._stopping}.", file=sys.stderr)
    return _SIGNALLED["requested"]

  def agreed(self) -> bool:
    """Whether any process was signalled. Every process gets the same
    answer (one small all-gather where there are several: each must call
    it alike), so all of them save and stop at the same step."""
    return any_process(self.requested)[0]

  def interrupt(self) -> None:
    """Raises Interrupted once a stop is agreed (`agreed`: every process
    calls it at the same points). Long work calls it between its parts
    (Context.interrupt: a rollout's sampler calls, an evaluation's
    chunks), so that a stop does not wait for all of it."""
    if self.agreed():
      raise Interrupted("a stop was requested")

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and _SIGNALLED["requested"]:
      raise KeyboardInterrupt  # the second Ctrl-C
    _SIGNALLED["requested"] = True
    what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    again = " (Ctrl-C again stops at once)" if signum == signal.SIGINT else ""
    print(
      f"{what}: {self._stopping}{again}.",
      file=sys.stderr,
      flush=True,
    )

  def restore_handlers(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
    if self._alive:
      self._alive = False
      _SIGNALLED["alive"] -= 1

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.restore_handlers()
