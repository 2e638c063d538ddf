"""A persistent process pool for verifiers, with a hard per-item timeout.

Why not concurrent.futures: a verifier can hang inside C code (sympy
evaluating `9^{9^{9^{9}}}` is a big-integer power), and a ProcessPoolExecutor
cannot kill one stuck worker. Here each worker is a fresh interpreter (never
fork: the parent runs JAX threads) with its own socket pair speaking
`multiprocessing.connection`. The parent sends one item at a time and waits
with a deadline; a worker that misses it is killed and replaced, and the item
scores 0 with status TIMEOUT. Math-Verify's own SIGALRM timeouts only work on
a main thread, so they are disabled in the workers (verl PR #5839 pattern);
instead a soft timer (SIGALRM in the worker's own main thread, at 80% of the
limit) stops interruptible work early without losing the worker, and the
kill is the backstop.

Workers lower their address-space limit (`memory_limit_mb`) so a blow-up
raises MemoryError instead of taking the host down, ignore SIGINT (the parent
owns shutdown), and exit when the parent's end of the pipe closes. `close()`
runs at exit and reaps every worker, so none is left as a zombie.

Functions sent to the pool (and `warmup`) must be importable module-level
functions: workers unpickle them by module and name.
"""

import atexit
import collections
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

OK, TIMEOUT, CRASH, ERROR, REJECTED = range(5)
STATUS_NAMES = ("ok", "timeout", "crash", "error", "rejected")
_READY = "ready"


class _SoftTimeout(BaseException):
  """Raised by the worker's timer; BaseException so `except Exception` in
  verifier code cannot swallow it."""


def _on_alarm(signum, frame):
  raise _SoftTimeout()


def _worker_main(conn, memory_limit_mb, warmup):
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGALRM, _on_alarm)
  if memory_limit_mb:
    import resource  # Unix only, like the rest of the pool.

    limit = int(memory_limit_mb) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  if warmup is not None:
    warmup()
  conn.send(_READY)
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg is None:
      return
    index, fn, args, soft_timeout = msg
    try:
      signal.setitimer(signal.ITIMER_REAL, soft_timeout)
      try:
        value = float(fn(*args))
      finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
      status = OK
    except _SoftTimeout:
      value, status = 0.0, TIMEOUT
    except Exception:  # noqa: BLE001 - any verifier error scores 0.
      value, status = 0.0, ERROR
    conn.send((index, value, status))


_CHILD_CODE = (
  "import sys, json; sys.path[:] = json.loads(sys.argv[1]);"
  " from rlreason.rewards.pool import _child_entry;"
  " _child_entry(int(sys.argv[2]))"
)


def _child_entry(fd: int):
  conn = multiprocessing.connection.Connection(fd)
  memory_limit_mb, warmup = conn.recv()
  _worker_main(conn, memory_limit_mb, warmup)


class _Worker:
  """One worker process and the parent's end of its socket pair.

  Started as `python -c` rather than through multiprocessing's spawn, which
  would re-run the top level of a `python script.py` main module in every
  worker (the classic missing `if __name__ == "__main__"` failure).
  """

  def __init__(self, memory_limit_mb, warmup):
    self.conn, child_conn = multiprocessing.Pipe(duplex=True)
    fd = child_conn.fileno()
    self.proc = subprocess.Popen(
      [sys.executable, "-c", _CHILD_CODE, json.dumps(sys.path), str(fd)],
      pass_fds=(fd,),
      stdin=subprocess.DEVNULL,
    )
    child_conn.close()
    self.conn.send((memory_limit_mb, warmup))
    self.started = time.monotonic()
    self.ready = False
    self.job = None  # (item index, deadline) while busy.

  @property
  def pid(self) -> int:
    return self.proc.pid

  def request_stop(self):
    try:
      self.conn.send(None)
    except (OSError, ValueError):
      pass

  def stop(self, grace_s: float = 0.0):
    """Waits up to `grace_s` for a requested exit, then kills; reaps."""
    try:
      self.proc.wait(timeout=grace_s if grace_s > 0 else 0.0)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
    self.conn.close()


class VerifierPool:
  """Runs `fn(*args)` for many items in worker processes, with timeouts.

  Example:
    with VerifierPool(num_workers=2, timeout=5.0) as pool:
      values, status = pool.map(fn, [(pred, gold), ...])

  `values` is float32 [N] (0 for every failed item), `status` int8 [N] with
  OK / TIMEOUT / CRASH / ERROR. `counts` accumulates statuses over calls.
  """

  def __init__(
    self,
    num_workers: int | None = None,
    timeout: float = 5.0,
    memory_limit_mb: int | None = 4096,
    warmup: Callable[[], Any] | None = None,
    start_timeout: float = 120.0,
  ):
    """Starts the workers (they warm up in the background).

    Args:
      num_workers: processes; default min(4, cpu count).
      timeout: default per-item wall-clock limit in seconds, measured from
        the moment the item is handed to an idle, warmed-up worker.
      memory_limit_mb: address-space cap per worker (None: no cap).
      warmup: picklable function each worker runs once before taking work
        (e.g. imports), so the first item is not charged for it.
      start_timeout: seconds a worker may take to become ready.
    """
    self.num_workers = num_workers or min(4, os.cpu_count() or 1)
    self.timeout = timeout
    self.start_timeout = start_timeout
    self._memory_limit_mb = memory_limit_mb
    self._warmup = warmup
    self.counts = collections.Counter()
    self._lock = threading.Lock()  # One map() at a time.
    self._start_failures = 0
    self._workers = [self._new_worker() for _ in range(self.num_workers)]
    self._closed = False
    atexit.register(self.close)

  def _new_worker(self) -> _Worker:
    return _Worker(self._memory_limit_mb, self._warmup)

  def _replace(self, k: int):
    self._workers[k].stop()
    self._workers[k] = self._new_worker()

  def pids(self) -> list[int]:
    return [w.pid for w in self._workers]

  def map(
    self,
    fn: Callable[..., float],
    items: Sequence[tuple],
    timeout: float | None = None,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Runs `fn(*item)` for every item; returns (values [N], status [N]).

    Args:
      fn: a module-level (picklable) function returning a float.
      items: argument tuples.
      timeout: per-item limit in seconds (default: the pool's).
    """
    with self._lock:
      return self._map(fn, items, timeout)

  def _map(self, fn, items, timeout):
    if self._closed:
      raise RuntimeError("VerifierPool is closed")
    timeout = self.timeout if timeout is None else timeout
    values = np.zeros(len(items), np.float32)
    status = np.full(len(items), OK, np.int8)
    pending = collections.deque(range(len(items)))

    def finish(k, value, code):
      index = self._workers[k].job[0]
      values[index], status[index] = value, code
      self.counts[STATUS_NAMES[code]] += 1
      self._workers[k].job = None

    while pending or any(w.job for w in self._workers):
      now = time.monotonic()
      for k, w in enumerate(self._workers):
        if w.ready and w.job is None and pending:
          index = pending.popleft()
          try:
            w.conn.send((index, fn, items[index], 0.8 * timeout))
          except (OSError, ValueError):  # Died while idle: retry elsewhere.
            pending.appendleft(index)
            self._replace(k)
            continue
          w.job = (index, now + timeout)
        elif not w.ready and now - w.started > self.start_timeout:
          raise RuntimeError(
            f"verifier worker did not start within {self.start_timeout}s"
          )
      deadlines = [w.job[1] for w in self._workers if w.job]
      wait_s = min(deadlines) - now if deadlines else 1.0
      by_conn = {w.conn: k for k, w in enumerate(self._workers)}
      busy = [w.conn for w in self._workers if w.job or not w.ready]
      for conn in multiprocessing.connection.wait(busy, max(wait_s, 0.0)):
        k = by_conn[conn]
        try:
          msg = conn.recv()
        except (EOFError, OSError):  # The worker died (segfault, OOM kill).
          if self._workers[k].job:
            finish(k, 0.0, CRASH)
          elif not self._workers[k].ready:
            self._start_failures += 1
            if self._start_failures > 3:
              raise RuntimeError(
                "verifier workers die during start-up (see their stderr)"
              ) from None
          self._replace(k)
          continue
        if msg == _READY:
          self._workers[k].ready = True
          self._start_failures = 0
        else:
          finish(k, msg[1], msg[2])
      now = time.monotonic()
      for k, w in enumerate(self._workers):
        if w.job and now >= w.job[1]:
          finish(k, 0.0, TIMEOUT)
          self._replace(k)  # Stuck in C code: kill, start a fresh one.
    return values, status

  def close(self):
    """Stops every worker and waits for it (idempotent)."""
    if getattr(self, "_closed", True):
      return
    self._closed = True
    for w in self._workers:
      w.request_stop()
    deadline = time.monotonic() + 2.0
    for w in self._workers:
      # A worker still warming up would only read the request afterwards.
      grace = deadline - time.monotonic() if w.ready else 0.0
      w.stop(grace_s=max(0.0, grace))
    atexit.unregister(self.close)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
