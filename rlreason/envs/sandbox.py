"""Runs untrusted Python snippets (tool calls) in a sandboxed subprocess.

  res = sandbox.run_python("print(6 * 7)", timeout_s=2.0, memory_mb=256)
  res.status, res.stdout  # "ok", "42\n"

Each call is a fresh interpreter (`python -I`, never fork: the parent runs
JAX threads) started in its own temporary directory, which is deleted
afterwards. Inside the child, before the snippet runs:

  time     RLIMIT_CPU = timeout_s (+1 s), and the parent kills the child at
           the wall-clock deadline (status "timeout");
  memory   RLIMIT_AS = memory_mb (MemoryError -> status "memory");
  files    RLIMIT_FSIZE caps any file; an audit hook (PEP 578, cannot be
           removed from Python code) refuses opening for writing, creating,
           removing or renaming any path outside the temp directory;
  network  the child runs under `unshare -n` (an empty network namespace)
           when the host allows it, and the audit hook refuses socket
           creation and connects in any case;
  procs    the audit hook refuses subprocess / exec / fork / spawn, and
           ctypes (which could bypass everything above).

This is the level of isolation of the RL frameworks' local code runners
(verl prime_code, R1-Code-Interpreter): enough against runaway or careless
model code, not a security boundary against a determined adversary (use a
container or gVisor for that).
"""

import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tempfile

STATUSES = ("ok", "error", "timeout", "memory", "denied")

# Runs in the child: limits, then the audit hook, then the snippet.
_BOOTSTRAP = r"""
import os, resource, sys
_root = os.path.realpath(sys.argv[1])
_cpu, _mem, _fsize = (int(x) for x in sys.argv[2:5])
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu))
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
os.chdir(_root)
_code = open(os.path.join(_root, "snippet.py")).read()

def _inside(path):
  try:
    p = os.path.realpath(os.fsdecode(path))
  except Exception:
    return False
  return p == _root or p.startswith(_root + os.sep)

_BANNED = ("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.fork",
           "os.system", "os.spawn", "os.kill", "ctypes.", "pty.", "fcntl.")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir",
                "os.symlink", "os.link", "os.chmod", "os.chown",
                "os.truncate", "shutil.rmtree", "shutil.copyfile")

def _hook(event, args):
  if event.startswith(_BANNED) and event != "socket.getaddrinfo":
    raise PermissionError(f"sandbox: {event} is not allowed")
  if event == "socket.getaddrinfo":
    raise PermissionError("sandbox: no network")
  if event == "open" and args:
    path, mode = args[0], args[1]
    writing = isinstance(mode, str) and any(c in mode for c in "wax+")
    if isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR |
                                               os.O_CREAT):
      writing = True
    if writing and not isinstance(path, int) and not _inside(path):
      raise PermissionError(f"sandbox: no writes outside {_root}")
  if event in _PATH_EVENTS:
    for path in args[:2]:
      if isinstance(path, (str, bytes, os.PathLike)) and not _inside(path):
        raise PermissionError(f"sandbox: {event} outside {_root}")

sys.addaudithook(_hook)
del _hook
exec(compile(_code, "<tool>", "exec"), {"__name__": "__main__"})
"""


@dataclasses.dataclass(frozen=True)
class Result:
  """Outcome of one snippet.

  Attributes:
    status: one of STATUSES: "ok" (exit 0), "error" (an exception),
      "timeout" (killed at the deadline or by RLIMIT_CPU), "memory"
      (MemoryError), "denied" (the sandbox refused an operation).
    stdout: captured standard output, truncated to max_output chars.
    stderr: captured standard error (the traceback), truncated.
  """

  status: str
  stdout: str
  stderr: str


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
  """Whether `unshare -n` works here (root or unprivileged user ns)."""
  exe = shutil.which("unshare")
  if exe is None:
    return False
  try:
    probe = subprocess.run([exe, "-n", "true"], capture_output=True, timeout=10)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return probe.returncode == 0


def run_python(
  code: str,
  *,
  timeout_s: float = 2.0,
  memory_mb: int = 256,
  max_file_mb: int = 8,
  max_output: int = 2000,
  isolate_network: bool = True,
) -> Result:
  """Executes `code` in a fresh sandboxed interpreter.

  Args:
    code: Python source.
    timeout_s: wall-clock limit (CPU limit: its ceiling + 1 s).
    memory_mb: address-space limit of the child.
    max_file_mb: largest file the child may write (inside its temp dir).
    max_output: stdout / stderr are truncated to this many characters.
    isolate_network: also run under `unshare -n` when available.

  Returns:
    A Result; never raises for anything the snippet does.
  """
  root = tempfile.mkdtemp(prefix="rr_sandbox_")
  try:
    with open(os.path.join(root, "snippet.py"), "w") as f:
      f.write(code)
    with open(os.path.join(root, "boot.py"), "w") as f:
      f.write(_BOOTSTRAP)
    cmd = [
      sys.executable,
      "-I",  # isolated: no user site, no PYTHON* env, no cwd on sys.path
      os.path.join(root, "boot.py"),
      root,
      str(int(timeout_s) + 1),
      str(int(memory_mb) * 2**20),
      str(int(max_file_mb) * 2**20),
    ]
    if isolate_network and network_namespace_available():
      cmd = [shutil.which("unshare"), "-n", *cmd]
    env = {"PATH": "/usr/bin:/bin", "HOME": root, "TMPDIR": root}
    try:
      proc = subprocess.run(
        cmd,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
      )
    except subprocess.TimeoutExpired as e:
      out = e.stdout.decode("utf-8", "replace") if e.stdout else ""
      return Result("timeout", out[:max_output], "")
    out, err = proc.stdout[:max_output], proc.stderr[-max_output:]
    return Result(_status(proc.returncode, proc.stderr), out, err)
  finally:
    shutil.rmtree(root, ignore_errors=True)


def _status(returncode: int, stderr: str) -> str:
  if returncode == 0:
    return "ok"
  if "MemoryError" in stderr:
    return "memory"
  if "sandbox:" in stderr:
    return "denied"
  if returncode in (-9, -24, 137, 152):  # SIGKILL / SIGXCPU (RLIMIT_CPU)
    return "timeout"
  return "error"
