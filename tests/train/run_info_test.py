"""run_info.current_commit: HEAD, "-dirty" only for changes that count;
code_changes: the code a run was not made by;
compile_cache_dir: where --compile_cache keeps compiled programs."""

import dataclasses
import os
import subprocess

import jax
import jax.numpy as jnp
from jax.experimental.compilation_cache import compilation_cache

from rlreason import config
from rlreason.train import run_info


def _git(repo, *args):
  subprocess.run(
    ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
    cwd=repo,
    check=True,
    capture_output=True,
  )


def _commit_all(repo) -> str:
  """A new repository at `repo` holding its files; returns the commit."""
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "commit", "-q", "-m", "init")
  return subprocess.run(
    ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
  ).stdout.strip()


def test_dirty_ignores_only_the_named_paths(tmp_path, monkeypatch):
  repo = tmp_path / "repo"
  (repo / "pkg").mkdir(parents=True)
  (repo / "results").mkdir()
  (repo / "pkg" / "code.py").write_text("x = 1\n")
  (repo / "results" / "r.json").write_text("{}\n")
  head = _commit_all(repo)
  # As in the package: asked from a subdirectory, answered for the whole repo.
  monkeypatch.setattr(run_info, "_HERE", str(repo / "pkg"))
  assert run_info.current_commit() == head

  (repo / "results" / "r.json").write_text('{"row": 1}\n')
  assert run_info.current_commit() == head + "-dirty"
  assert run_info.current_commit(ignore=("results",)) == head

  (repo / "pkg" / "code.py").write_text("x = 2\n")
  assert run_info.current_commit(ignore=("results",)) == head + "-dirty"


def test_the_compile_cache_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  cfg = dataclasses.replace(config.BaseConfig(), cache_dir="c")
  where = lambda environ, **kw: run_info.compile_cache_dir(  # noqa: E731
    dataclasses.replace(cfg, **kw), environ
  )
  env = {"JAX_COMPILATION_CACHE_DIR": "/shared/jax"}
  # auto: under --cache_dir (made absolute), unless the environment names one.
  assert where({}) == os.path.join(tmp_path, "c", "xla")
  assert where(env) == "/shared/jax"
  assert where(env, compile_cache="off") == where({}, compile_cache="off") == ""
  assert where(env, compile_cache="mine") == os.path.join(tmp_path, "mine")
  assert where({}, compile_cache="gs://b/xla") == "gs://b/xla"


def test_a_run_turns_the_compile_cache_off_and_on_in_one_process(tmp_path):
  """A notebook's runs share a process: a directory, --compile_cache=off,
  then another directory, each taking effect at the next compile (the
  suite keeps every program: tests/conftest.py's minimum time is 0)."""
  before = (
    jax.config.jax_enable_compilation_cache,
    jax.config.jax_compilation_cache_dir,
  )
  cfg = dataclasses.replace(config.BaseConfig(), cache_dir=str(tmp_path))
  use = lambda where: run_info.use_compile_cache(  # noqa: E731
    dataclasses.replace(cfg, compile_cache=where)
  )
  kept = lambda where: sorted(  # noqa: E731
    n for n in os.listdir(where) if n.startswith("jit__lambda")
  )
  first, second = str(tmp_path / "first"), str(tmp_path / "second")
  try:
    assert use(first) == first == jax.config.jax_compilation_cache_dir
    jax.jit(lambda x: x * 5 - 2)(jnp.arange(3))
    assert len(kept(first)) == 1
    assert use("off") == "" and not jax.config.jax_enable_compilation_cache
    jax.jit(lambda x: x * 7 + 3)(jnp.arange(3))
    assert len(kept(first)) == 1
    assert use(second) == second and jax.config.jax_enable_compilation_cache
    jax.jit(lambda x: x * 9 - 4)(jnp.arange(3))
    assert len(kept(second)) == 1 and len(kept(first)) == 1
  finally:
    jax.config.update("jax_enable_compilation_cache", before[0])
    compilation_cache.set_cache_dir(before[1])
    compilation_cache.reset_cache()


def test_code_changes_lists_the_code_a_run_was_not_made_by(tmp_path):
  """A run's COMMIT against today's tree: the .py files under rlreason/ and
  experiments/ that differ, committed since or not; documents and results
  do not count; None for a commit git does not have."""
  repo = tmp_path / "repo"
  for path in ("rlreason/rl/loss.py", "experiments/m.py", "docs/a.py"):
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("x = 1\n")
  (repo / "experiments" / "README.md").write_text("table\n")
  made = _commit_all(repo)
  run = tmp_path / "run"
  run.mkdir()
  assert run_info.commit_of(str(run)) is None
  (run / "COMMIT").write_text(made + "\n")
  assert run_info.commit_of(str(run)) == made
  sub = str(repo / "rlreason")  # asked from inside, as the package is
  assert run_info.code_changes(made, repo=sub) == []

  (repo / "rlreason" / "rl" / "loss.py").write_text("x = 2\n")
  _git(repo, "commit", "-q", "-am", "a change of code")
  for path in ("experiments/README.md", "docs/a.py"):
    (repo / path).write_text("changed\n")
  (repo / "experiments" / "m.py").write_text("x = 3\n")  # not committed
  changed = run_info.code_changes(made + "-dirty", repo=sub)
  assert changed == ["experiments/m.py", "rlreason/rl/loss.py"]
  assert run_info.code_changes("0" * 40, repo=sub) is None
