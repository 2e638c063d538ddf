"""run_info.current_commit: HEAD, "-dirty" only for changes that count."""

import subprocess

from rlreason.train import run_info


def _git(repo, *args):
  subprocess.run(
    ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
    cwd=repo,
    check=True,
    capture_output=True,
  )


def test_dirty_ignores_only_the_named_paths(tmp_path, monkeypatch):
  repo = tmp_path / "repo"
  (repo / "pkg").mkdir(parents=True)
  (repo / "results").mkdir()
  (repo / "pkg" / "code.py").write_text("x = 1\n")
  (repo / "results" / "r.json").write_text("{}\n")
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "commit", "-q", "-m", "init")
  head = subprocess.run(
    ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
  ).stdout.strip()
  # As in the package: asked from a subdirectory, answered for the whole repo.
  monkeypatch.setattr(run_info, "_HERE", str(repo / "pkg"))
  assert run_info.current_commit() == head

  (repo / "results" / "r.json").write_text('{"row": 1}\n')
  assert run_info.current_commit() == head + "-dirty"
  assert run_info.current_commit(ignore=("results",)) == head

  (repo / "pkg" / "code.py").write_text("x = 2\n")
  assert run_info.current_commit(ignore=("results",)) == head + "-dirty"
