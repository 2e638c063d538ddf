"""Orbax checkpoints of a run: TrainState + the host-side position.

  ckpt = Checkpointer(workdir + "/checkpoints", keep=2)
  ckpt.save(step, state, meta={"data": data_state, "seed": seed})
  state, meta = ckpt.restore(abstract_state)  # latest, or (None, None)

Orbax writes into a temporary directory and renames it when complete, so an
interrupted save never leaves a half checkpoint behind. `meta` is JSON
(the data iterator position, RNG seed, anything the loop needs to continue
exactly). A state holding a non-finite value is refused: a checkpoint never
contains NaN.

`Preemption` turns SIGTERM (TPU maintenance, SLURM time limit) into a flag
the loop polls between steps, so it can save and exit cleanly.
"""

import os
import signal
import threading

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging

from rlreason import storage


class Checkpointer:
  """Keep-last-N orbax checkpoints in `directory` (local path or gs://)."""

  def __init__(self, directory: str, keep: int = 2):
    # Orbax resolves URLs (gs://) itself; a local path must be absolute.
    directory = os.fspath(directory)
    if storage.is_local(directory):
      directory = os.path.abspath(directory)
    self.directory = directory
    self._manager = ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=False
      ),
      item_names=("state", "meta"),
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state, meta: dict) -> None:
    """Saves `state` and `meta`; every process must call it (multi-host)."""
    if not bool(_all_finite(state)):
      raise ValueError(
        f"Refusing to checkpoint step {step}: the state holds non-finite values"
      )
    self._manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
      ),
      force=True,
    )
    self._manager.wait_until_finished()
    logging.info("Saved checkpoint %d to %s", step, self.directory)

  def restore(self, abstract_state, step: int | None = None):
    """(state, meta) at `step` (default latest), or (None, None) if none.

    `abstract_state` is a pytree of jax.ShapeDtypeStruct with shardings: the
    arrays come back directly in that layout.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      return None, None
    out = self._manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        meta=ocp.args.JsonRestore(),
      ),
    )
    logging.info("Restored checkpoint %d from %s", step, self.directory)
    return out.state, out.meta

  def close(self):
    self._manager.close()


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


class Preemption:
  """Records SIGTERM / SIGINT so the loop can checkpoint and stop."""

  def __init__(self, signals=(signal.SIGTERM,)):
    self.requested = False
    self._previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in signals:
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    logging.warning("Received signal %d: checkpointing and stopping.", signum)
    self.requested = True

  def restore_handlers(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
