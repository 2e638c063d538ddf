"""--workdir=gs://...: a run writes every file through etils.epath, resumes.

A stand-in for GCS: fsspec's in-memory filesystem, registered for the "gs"
and "gcs" protocols (as gcsfs registers itself) and, like GCS, refusing to
append to an object. With tensorflow's gfile switched off
(EPATH_USE_TF=false), etils.epath routes gs:// paths to fsspec, so to it.

Orbax writes checkpoint arrays through TensorStore's own GCS driver, which
no fsspec filesystem can intercept: the run's gs:// checkpoint directory is
mapped to a local one here (orbax's gs:// support is its own).
"""

import dataclasses
import json
import os

import fsspec
import jax
import numpy as np
import pytest
from etils import epath
from fsspec.implementations import memory

from experiments import evaluate as evaluate_cli
from experiments import grpo
from rlreason.eval import trained
from rlreason.train import checkpoint
from rlreason import metrics
from rlreason.train import loaders
from rlreason.train import report
from rlreason.train import run_policy
from rlreason import storage
from rlreason import testing

WORKDIR = "gs://bucket/run"


class FakeGCS(memory.MemoryFileSystem):
  """An in-memory bucket store whose objects cannot be appended to."""

  protocol = ("gs", "gcs")
  store = {}  # not memory://'s
  pseudo_dirs = [""]

  @classmethod
  def _strip_protocol(cls, path):
    path = fsspec.utils.stringify_path(path)
    for prefix in ("gs://", "gcs://"):
      path = path.removeprefix(prefix)
    return super()._strip_protocol(path)

  def _open(self, path, mode="rb", **kwargs):
    if "a" in mode:
      raise OSError(f"GCS objects cannot be appended to: {path}")
    return super()._open(path, mode, **kwargs)


def _files() -> dict[str, bytes]:
  """The fake bucket's objects by gs:// URL."""
  return {
    "gs://" + k.lstrip("/"): f.getvalue() for k, f in FakeGCS.store.items()
  }


def _steps(directory) -> list[str]:
  return sorted(p for p in os.listdir(directory) if p.isdigit())


@pytest.fixture
def gcs(monkeypatch):
  monkeypatch.setenv("EPATH_USE_TF", "false")
  for protocol in FakeGCS.protocol:
    fsspec.register_implementation(protocol, FakeGCS, clobber=True)
  FakeGCS.store.clear()
  FakeGCS.pseudo_dirs[:] = [""]
  FakeGCS.clear_instance_cache()
  yield
  FakeGCS.store.clear()


def test_epath_routes_gs_to_the_fake_bucket(gcs):
  path = epath.Path(WORKDIR) / "probe.json"
  storage.write_json(path, {"a": 1})
  assert _files() == {f"{WORKDIR}/probe.json": b'{\n  "a": 1\n}'}
  assert storage.read_json(path) == {"a": 1}
  assert storage.read_json(epath.Path(WORKDIR) / "missing.json") is None
  with pytest.raises(OSError, match="appended"):
    path.open("a")


def test_metric_writer_rewrites_a_remote_object(gcs):
  w = metrics.MetricWriter(WORKDIR, tensorboard=False, upload_secs=3600)
  w.write(1, {"loss": 1.0})
  assert f"{WORKDIR}/metrics.jsonl" not in _files()  # not yet uploaded
  w.flush()
  w.write(2, {"loss": 2.0})
  w.close()
  rows = metrics.read_jsonl(f"{WORKDIR}/metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  # A resumed run continues the object.
  w = metrics.MetricWriter(WORKDIR, tensorboard=False, upload_secs=0)
  w.write(3, {"loss": 3.0})  # upload_secs=0: uploaded at once
  rows = metrics.read_jsonl(f"{WORKDIR}/metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3]
  w.close()


def test_grpo_writes_its_workdir_to_gcs_and_resumes(gcs, tmp_path, monkeypatch):
  local_ckpt = tmp_path / "checkpoints"

  class LocalCheckpointer(checkpoint.Checkpointer):
    def __init__(self, directory, **kwargs):
      if directory.startswith("gs://"):  # the run's; the warm start's is local
        assert directory == f"{WORKDIR}/checkpoints", directory
        directory = str(local_ckpt)
      super().__init__(directory, **kwargs)

  monkeypatch.setattr(checkpoint, "Checkpointer", LocalCheckpointer)
  # A gs:// URL taken for a local path would create ./gs:/bucket/run.
  monkeypatch.chdir(tmp_path)
  cfg = dataclasses.replace(
    grpo.TinyConfig(),
    **testing.SMOKE,
    workdir=WORKDIR,
    cache_dir=str(tmp_path / "cache"),
  )
  out = grpo.run(cfg)
  assert out["workdir"] == WORKDIR
  files = _files()
  for name in (
    "config.json",
    "COMMIT",
    "metrics.jsonl",
    "eval_before.json",
    "eval_after.json",
    "report.md",
    "curves.png",
  ):
    assert f"{WORKDIR}/{name}" in files, (name, sorted(files))
  assert json.loads(files[f"{WORKDIR}/config.json"])["workdir"] == WORKDIR
  assert files[f"{WORKDIR}/curves.png"].startswith(b"\x89PNG")
  assert f"`{WORKDIR}`" in files[f"{WORKDIR}/report.md"].decode()
  rows = metrics.read_jsonl(f"{WORKDIR}/metrics.jsonl")
  assert [r["step"] for r in rows if "loss" in r] == [1, 2]
  assert _steps(local_ckpt) == ["1", "2"]
  assert sorted(os.listdir(tmp_path)) == ["cache", "checkpoints"]

  # Two more steps: resumes from checkpoint 2, continues metrics.jsonl.
  more = grpo.run(dataclasses.replace(cfg, steps=4))
  assert more["workdir"] == WORKDIR
  rows = metrics.read_jsonl(f"{WORKDIR}/metrics.jsonl")
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
  assert _steps(local_ckpt) == ["3", "4"]
  assert sorted(os.listdir(tmp_path)) == ["cache", "checkpoints"]
  # The report reads the remote workdir (as `python -m rlreason.train.report`).
  assert report.write(WORKDIR, title="again") == f"{WORKDIR}/report.md"
  assert "# again" in _files()[f"{WORKDIR}/report.md"].decode()

  # experiments.evaluate reads it too (its checkpoints through orbax, mapped
  # to the local directory as the run's were; a placeholder object stands
  # for them in the bucket) and writes its files here, by default under
  # workdirs/eval/<run>/step_<N>.
  (epath.Path(WORKDIR) / "checkpoints" / "4" / "_CHECKPOINT").write_text("")
  manager = run_policy.ocp.CheckpointManager

  def local_manager(directory, *args, **kwargs):
    assert os.fspath(directory) == f"{WORKDIR}/checkpoints", directory
    return manager(str(local_ckpt), *args, **kwargs)

  monkeypatch.setattr(run_policy.ocp, "CheckpointManager", local_manager)
  res = evaluate_cli.run(evaluate_cli.Config(checkpoint=WORKDIR, mesh_fsdp=1))
  assert res["out"] == os.path.join("workdirs", "eval", "run", "step_4")
  assert res["policy"].step == 4 and res["policy"].workdir == WORKDIR
  summary = json.loads((tmp_path / res["out"] / "eval.json").read_text())
  after = json.loads(_files()[f"{WORKDIR}/eval_after.json"])
  assert summary["accuracy"] == after["eval/accuracy"]
  assert summary["problems"] == cfg.eval_size
  # Another run starts from it: --init_from=gs://... (its latest step).
  second = dataclasses.replace(cfg, init_from=WORKDIR, workdir=str(tmp_path))
  _, params = loaders.load_model(second, res["policy"].mesh)
  jax.tree.map(np.testing.assert_array_equal, params, res["policy"].params)
  # --out on gs:// too: the same files in the bucket; the journal on local
  # disk (appended to row by row), gone once they are written.
  journals = testing.spy(
    monkeypatch,
    evaluate_cli.evaluate_lib,
    "evaluate",
    lambda *a, **k: k["journal_dir"],
  )
  out = "gs://bucket/ev"
  evaluate_cli.run(
    evaluate_cli.Config(checkpoint=WORKDIR, mesh_fsdp=1, out=out)
  )
  assert journals == [
    os.path.join("workdirs", "eval", "partial", "gs", "bucket", "ev")
  ]
  assert not (tmp_path / journals[0]).exists()
  files = _files()
  for name in ("eval.md", "eval.json", "samples.jsonl"):
    local = (tmp_path / res["out"] / name).read_bytes()
    assert files[f"{out}/{name}"] == local, name
  # A step of it, and one it does not hold, as on local disk.
  locate = run_policy.locate
  assert locate(f"{WORKDIR}/checkpoints/4") == ("workdir", WORKDIR, 4)
  assert locate(f"{WORKDIR}/checkpoints") == ("workdir", WORKDIR, None)
  with pytest.raises(trained.CheckpointError, match=r"saved steps: \[4\]"):
    locate(f"{WORKDIR}/checkpoints/9")


def test_report_names_where_the_parameters_came_from():
  assert report._init({"model": "tiny"}) == "random init"  # noqa: SLF001
  assert report._init({"model": "/ckpt/qwen"}) == "its weights"  # noqa: SLF001
  assert report._init({"model": "laptop-base"}) == "its weights"  # noqa: SLF001
  got = report._init({"model": "tiny", "init_from": "w/cache"})  # noqa: SLF001
  assert got == "init from `w/cache`"


def test_eval_line_gives_accuracy_then_the_larger_ks():
  """Accuracy is pass@1 (every sample's mean; mean@1 is the first sample's
  alone), then pass@k and maj@k for k > 1 by k, then what was evaluated."""
  got = report.eval_line(
    {
      "eval/accuracy": 0.25,
      "eval/mean@1": 0.5,
      "eval/mean@1_lo": 0.25,
      "eval/mean@1_hi": 0.75,
      "eval/pass@1": 0.25,
      "eval/pass@1_lo": 0.125,
      "eval/pass@1_hi": 0.5,
      "eval/pass@16": 0.875,
      "eval/pass@4": 0.75,
      "eval/pass@4_lo": 0.5,
      "eval/pass@4_hi": 0.875,
      "eval/maj@4": 0.375,
      "eval/mean@4": 0.25,
      "step": 3,
    }
  )
  assert got == (
    "accuracy 25.0% [12.5, 50.0] | pass@4 75.0% [50.0, 87.5] | pass@16 87.5%"
    " | maj@4 37.5%"
  )
  one = {"eval/pass@1": 0.5, "problems": 140, "trained_on": 0, "samples": 1}
  assert report.eval_line(one) == (
    "accuracy 50.0% | 140 held-out problems, greedy"
  )
  many = {**one, "trained_on": 3, "samples": 4}
  assert report.eval_line(many) == (
    "accuracy 50.0% | 140 problems (3 trained on), 4 samples each"
  )


@pytest.mark.parametrize(
  "shared, heading, label",
  [
    (0, "## Held-out evaluation", "held-out (eval)"),
    (
      4,
      "## Evaluation (4 of 8 problems are training problems)",
      "eval (4 of 8 trained on)",
    ),
  ],
)
def test_report_says_whether_the_evaluation_was_held_out(
  tmp_path, monkeypatch, shared, heading, label
):
  plotted = []
  monkeypatch.setattr(report, "plot_curves", lambda *a: plotted.append(a[3]))
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
  for name, acc in (("eval_before.json", 0.25), ("eval_after.json", 0.5)):
    (tmp_path / name).write_text(
      json.dumps({"eval/accuracy": acc, "problems": 8, "trained_on": shared})
    )
  report.write(str(tmp_path), title="t")
  text = (tmp_path / "report.md").read_text()
  assert heading in text
  assert "| accuracy | 25.0% | 50.0% |" in text
  assert plotted == [label]  # the curves' legend says it too


def test_report_cli_names_a_directory_that_is_not_a_run(tmp_path, capsys):
  assert report.main(["report", str(tmp_path)]) == 2
  assert f"error: {tmp_path}: no metrics.jsonl" in capsys.readouterr().err
  assert report.main(["report"]) == 2
  (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
  assert report.main(["report", str(tmp_path)]) == 0
  assert capsys.readouterr().out == f"{tmp_path}/report.md\n"
  # Written again (the CLI gives no title), it keeps the run's own title.
  report.write(str(tmp_path), title="GRPO (DeepSeekMath)")
  assert report.main(["report", str(tmp_path)]) == 0
  heading = (tmp_path / "report.md").read_text().splitlines()[0]
  assert heading == "# GRPO (DeepSeekMath)"


def test_report_shows_where_the_time_goes_and_the_mfu(tmp_path, monkeypatch):
  """The training table's speed rows: phase seconds, tokens/s and, where
  the rows hold it (a GPU or TPU run), mfu/update; none a run lacks."""
  monkeypatch.setattr(report, "plot_curves", lambda *a: None)
  rows = [
    {"step": s, "reward": 0.5, "time/update": float(s), "mfu/update": 0.25}
    for s in range(1, 21)
  ]
  (tmp_path / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in rows)
  )
  report.write(str(tmp_path), title="t")
  text = (tmp_path / "report.md").read_text()
  assert "| time/update | 5.500 | 15.500 |" in text  # steps 1-10, 11-20
  assert "| mfu/update | 0.250 | 0.250 |" in text
  assert "time/rollout" not in text
