"""experiments/evaluate.py: workdirs, their HF exports and presets score as
the loop scores them; bad checkpoint paths fail with the path named."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys

import jax
from jax.experimental.compilation_cache import compilation_cache
import numpy as np
import pytest

from experiments import evaluate as evaluate_cli
from experiments import grpo
from rlreason.data import sources as data_lib
from rlreason.eval import evaluate
from rlreason.train import context
from rlreason.train import loaders
from rlreason.train import run_info
from rlreason import config
from rlreason import metrics as metrics_lib
from rlreason import testing
from rlreason.eval import trained
from rlreason.model import presets
from rlreason.train import run_policy
from rlreason.model import hf

# One worker runs the module (--dist=loadgroup, pyproject.toml): the module
# fixture's training run would otherwise repeat on each worker.
pytestmark = pytest.mark.xdist_group("evaluate")

# As tests/experiments_test.py's: a 2-step GRPO in seconds.
SMOKE = testing.SMOKE
# One device; every evaluation samples 4 per problem, so all of them reuse
# the same two compiled samplers. Workdirs default to the run's eval set.
EVAL = dict(samples=4, mesh_fsdp=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("grpo")
  cfg = dataclasses.replace(
    grpo.TinyConfig(),
    **SMOKE,
    workdir=str(tmp / "run"),
    cache_dir=str(tmp / "cache"),
  )
  return cfg, grpo.run(cfg)


def _read(out_dir):
  with open(os.path.join(out_dir, "eval.json")) as f:
    summary = json.load(f)
  with open(os.path.join(out_dir, "samples.jsonl")) as f:
    samples = [json.loads(line) for line in f]
  return summary, samples


def _check_ranges(summary):
  for row in summary["metrics"].values():
    for v in row.values():
      assert -1e-9 <= v["low"] <= v["mean"] <= v["high"] <= 1 + 1e-9, v


def test_workdir_scores_as_the_loop(run, tmp_path):
  cfg, out = run
  res = evaluate_cli.run(
    evaluate_cli.Config(
      checkpoint=out["workdir"],
      ks="1,2,4",
      out=str(tmp_path / "eval"),
      **EVAL,
    )
  )
  for name in ("eval.md", "eval.json", "samples.jsonl"):
    assert os.path.exists(tmp_path / "eval" / name), name
  assert "| greedy |" in (tmp_path / "eval/eval.md").read_text()
  summary, samples = _read(tmp_path / "eval")
  _check_ranges(summary)
  assert summary["step"] == 2 and summary["problems"] == 4
  assert set(summary["metrics"]["n=4, T=1"]) == {
    f"{m}@{k}" for m in ("pass", "maj", "mean") for k in (1, 2, 4)
  }
  assert len(samples) == 4
  assert all(len(s["sampled"]["completions"]) == 4 for s in samples)

  # The latest checkpoint's params are the trained ones, bit for bit.
  policy = res["policy"]
  assert policy.step == 2 and policy.tokenizer == "char"
  jax.tree.map(
    np.testing.assert_array_equal, policy.params, out["state"].params
  )
  # Greedy accuracy is context.run_eval's on the same params and problems.
  ctx = context.Context(
    cfg,
    out["model_cfg"],
    loaders.load_tokenizer(cfg),
    policy.mesh,
    *loaders.make_reward_fns(cfg),
  )
  examples = data_lib.load(context.eval_spec(cfg), "eval")[: cfg.eval_size]
  assert [s["uid"] for s in samples] == [e.uid for e in examples]
  expected = context.run_eval(ctx, out["state"].params, examples, step=2)
  with open(os.path.join(out["workdir"], "eval_after.json")) as f:
    after = json.load(f)
  assert summary["accuracy"] == expected["eval/accuracy"]
  assert summary["accuracy"] == after["eval/accuracy"]


def test_exported_hf_dir_reloads_and_scores_the_same(run, tmp_path):
  _, out = run
  step_dir = os.path.join(out["workdir"], "checkpoints", "2")
  hf_dir = str(tmp_path / "hf")
  evaluate_cli.run(
    evaluate_cli.Config(
      checkpoint=step_dir, export_hf=hf_dir, evaluate=False, **EVAL
    )
  )
  assert not os.path.exists(os.path.join(out["workdir"], "eval"))
  _, params = hf.load(hf_dir)
  jax.tree.map(np.testing.assert_array_equal, params, out["state"].params)
  with open(os.path.join(hf_dir, trained.EXPORT_INFO)) as f:
    info = json.load(f)
  assert info["step"] == 2 and info["tokenizer"].startswith("char")
  transformers = pytest.importorskip("transformers")
  hf_cfg = transformers.AutoConfig.from_pretrained(hf_dir)
  assert hf_cfg.eos_token_id == 2 and hf_cfg.vocab_size == 128

  results = {}
  for name, source in (("workdir", step_dir), ("hf", hf_dir)):
    results[name] = evaluate_cli.run(
      evaluate_cli.Config(checkpoint=source, out=str(tmp_path / name), **EVAL)
    )
  assert results["hf"]["policy"].kind == "hf"
  assert results["hf"]["policy"].recorded  # the run's settings travel
  (a, samples_a), (b, samples_b) = (
    _read(tmp_path / "workdir"),
    _read(tmp_path / "hf"),
  )
  assert samples_a == samples_b  # same greedy and sampled completions
  assert a["accuracy"] == b["accuracy"] and a["metrics"] == b["metrics"]


def test_a_run_starts_from_another_runs_policy(run, tmp_path):
  """--init_from=<workdir> (or a step of it): that run's policy (as
  trained.load reads it), architecture and tokenizer; a run started so
  evaluates first what the other ended with, and its own workdir (whose
  recorded init_from is a run) loads for evaluation."""
  cfg, out = run
  mesh = out["state"].params["embedding"].sharding.mesh
  second = dataclasses.replace(
    cfg,
    steps=1,
    init_from=out["workdir"],
    workdir=str(tmp_path / "second"),
  )
  model_cfg, params = loaders.load_model(second, mesh)
  assert model_cfg == out["model_cfg"]
  jax.tree.map(np.testing.assert_array_equal, params, out["state"].params)
  assert loaders.tokenizer_source(second) == "char"
  # This run's dtypes, not the other's.
  bf16 = dataclasses.replace(second, dtype="bfloat16", param_dtype="bfloat16")
  bf16_cfg, bf16_params = loaders.load_model(bf16, mesh)
  assert (bf16_cfg.dtype, bf16_cfg.param_dtype) == ("bfloat16", "bfloat16")
  assert bf16_params["embedding"].dtype == jax.numpy.bfloat16
  step_1 = os.path.join(out["workdir"], "checkpoints", "1")
  _, params = loaders.load_model(
    dataclasses.replace(second, init_from=step_1), mesh
  )
  jax.tree.map(
    np.testing.assert_array_equal, params, trained.load(step_1).params
  )
  assert not jax.tree.all(  # step 1 is not step 2
    jax.tree.map(np.array_equal, params, out["state"].params)
  )

  result = grpo.run(second)
  evals = [
    r
    for r in metrics_lib.read_jsonl(
      os.path.join(second.workdir, "metrics.jsonl")
    )
    if "eval/accuracy" in r
  ]
  with open(os.path.join(out["workdir"], "eval_after.json")) as f:
    assert evals[0]["step"] == 0
    assert evals[0]["eval/accuracy"] == json.load(f)["eval/accuracy"]
  policy = trained.load(second.workdir)
  assert policy.step == 1 and policy.tokenizer == "char"
  jax.tree.map(
    np.testing.assert_array_equal, policy.params, result["state"].params
  )
  # The run records the step it started from, and keeps it when resumed
  # (its KL reference is built from it again) while the other goes on.
  step_2 = os.path.join(out["workdir"], "checkpoints", "2")
  recorded = json.loads((tmp_path / "second" / "config.json").read_text())
  assert recorded["init_from"] == step_2
  assert loaders.pinned(second, second.workdir).init_from == step_2
  (tmp_path / "third").mkdir()
  (tmp_path / "third" / "config.json").write_text(
    json.dumps({**recorded, "init_from": step_1})
  )
  assert loaders.pinned(second, str(tmp_path / "third")).init_from == step_1
  assert loaders.pinned(second, str(tmp_path / "new")).init_from == step_2
  (tmp_path / "third" / "config.json").write_text(  # a step since deleted
    json.dumps({**recorded, "init_from": step_1.replace("/1", "/9")})
  )
  with pytest.raises(config.ConfigError, match="started from its step 9"):
    loaders.pinned(second, str(tmp_path / "third"))


def test_compile_cache_is_the_runs_unless_the_flag_says(
  run, tmp_path, monkeypatch
):
  """A workdir's evaluation keeps its programs where the run kept its own
  (<its cache_dir>/xla without JAX_COMPILATION_CACHE_DIR), so rerunning it,
  or scoring another of the run's checkpoints, loads what compiled."""
  cfg, out = run
  before = (
    jax.config.jax_enable_compilation_cache,
    jax.config.jax_compilation_cache_dir,
  )
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  own = str(tmp_path / "own")
  use = lambda where: evaluate_cli.run(  # noqa: E731
    evaluate_cli.Config(
      checkpoint=out["workdir"], compile_cache=where, evaluate=False, **EVAL
    )
  )
  try:
    use("")
    assert jax.config.jax_enable_compilation_cache
    assert jax.config.jax_compilation_cache_dir == os.path.join(
      cfg.cache_dir, "xla"
    )
    use("off")
    assert not jax.config.jax_enable_compilation_cache
    use(own)
    assert jax.config.jax_enable_compilation_cache
    assert jax.config.jax_compilation_cache_dir == own
  finally:
    jax.config.update("jax_enable_compilation_cache", before[0])
    compilation_cache.set_cache_dir(before[1])
    compilation_cache.reset_cache()


def test_preset(tmp_path):
  res = evaluate_cli.run(
    evaluate_cli.Config(
      checkpoint="tiny",
      data="task:arithmetic:difficulty=1",
      num_problems=4,
      out=str(tmp_path / "eval"),
      # The run's lengths and chunking: the compiled samplers are reused.
      max_prompt_len=32,
      max_new_tokens=16,
      sequences_per_call=16,
      **EVAL,
    )
  )
  summary, samples = _read(tmp_path / "eval")
  _check_ranges(summary)
  assert res["policy"].kind == "preset" and summary["step"] is None
  assert summary["data"] == "task:arithmetic:difficulty=1,n=4"
  assert len(samples) == 4 and 0 <= summary["accuracy"] <= 1

  # Without --num_problems, a task spec's own n= counts, not eval_size.
  evaluate_cli.run(
    evaluate_cli.Config(
      checkpoint="tiny",
      data="task:arithmetic:difficulty=1,n=3",
      out=str(tmp_path / "eval_n"),
      max_prompt_len=32,
      max_new_tokens=16,
      sequences_per_call=16,
      **EVAL,
    )
  )
  summary, samples = _read(tmp_path / "eval_n")
  assert summary["data"] == "task:arithmetic:difficulty=1,n=3"
  assert summary["problems"] == len(samples) == 3


def test_a_shipped_checkpoint_is_named_as_the_run_flags_name_it():
  kind, path, step = run_policy.locate("laptop-base")
  assert (kind, path, step) == ("hf", presets.SHIPPED["laptop-base"], None)
  with pytest.raises(trained.CheckpointError, match="laptop-base"):
    run_policy.locate("no-such-model")


def test_a_model_too_large_for_the_devices_stops_before_loading(
  tmp_path, monkeypatch
):
  """qwen2.5-1.5b's float32 weights (5.8 GiB) on devices of 4 GiB in all:
  one line naming the flag and the way out, before any weight is read."""
  from rlreason.train import preflight

  monkeypatch.setattr(
    preflight.devices, "total_memory", lambda: (4 * 2**30, "test devices")
  )

  def tripwire(*args, **kwargs):
    raise AssertionError("the weights were loaded before the check")

  monkeypatch.setattr(loaders, "load_model", tripwire)
  with pytest.raises(config.ConfigError) as e:
    evaluate_cli.run(
      evaluate_cli.Config(checkpoint="qwen2.5-1.5b", out=str(tmp_path))
    )
  assert str(e.value) == (
    "--checkpoint=qwen2.5-1.5b: 1.54B weights need at least 5.8 GiB for the "
    "weights in float32, more than the 4.0 GiB of test devices. Use a "
    "smaller model, --param_dtype=bfloat16 or a larger slice (python -m "
    "experiments.plan sizes one)"
  )


@pytest.mark.parametrize("how", ["killed", "signalled"])
def test_an_interrupted_evaluation_resumes_where_it_stopped(
  tmp_path, monkeypatch, how
):
  """Stopped in the sampled decoding's second chunk: killed (a second
  Ctrl-C: KeyboardInterrupt there), or signalled (Ctrl-C: that chunk is
  finished and kept, then the run stops). The rerun decodes only what is
  not in the journals and writes the same files as a run never
  interrupted; the journals go once the files are written."""
  flags = dict(
    checkpoint="tiny",
    data="task:arithmetic:difficulty=1",
    num_problems=6,
    max_prompt_len=32,
    max_new_tokens=16,
    sequences_per_call=8,  # greedy: one chunk of 6; 4 samples: 3 chunks
    **EVAL,
  )
  whole = tmp_path / "whole"
  evaluate_cli.run(evaluate_cli.Config(out=str(whole), **flags))
  generate, calls = context.Context.generate, []

  def counted(self, *args, **kw):
    calls.append(kw["row_offset"])
    if len(calls) == fail_at and how == "killed":
      raise KeyboardInterrupt
    if len(calls) == fail_at:
      os.kill(os.getpid(), signal.SIGINT)
    return generate(self, *args, **kw)

  monkeypatch.setattr(context.Context, "generate", counted)
  out, fail_at = tmp_path / "again", 3
  config = evaluate_cli.Config(out=str(out), **flags)
  if how == "killed":
    with pytest.raises(KeyboardInterrupt):
      evaluate_cli.run(config)
  else:
    assert evaluate_cli.run(config)["stopped"]
  assert calls == [0, 0, 8]  # greedy; sampled rows 0-7 and then 8-15
  journals = {p.name.split("-")[0] for p in (out / "partial").iterdir()}
  assert journals == {"greedy", "n4"}
  calls.clear()
  fail_at = None
  evaluate_cli.run(config)
  # The sampled problems 2-5, or 4-5 where the signalled chunk was kept.
  assert calls == ([8, 16] if how == "killed" else [16])
  assert not (out / "partial").exists()
  for name in ("eval.json", "samples.jsonl"):
    assert (out / name).read_text() == (whole / name).read_text()
  assert (out / "at_k.png").read_bytes()[:4] == b"\x89PNG"  # k = 1, 2, 4


def test_the_at_k_plot_needs_two_ks(tmp_path):
  rows = {"greedy": {"pass@1": (0.5, 0.25, 0.75)}}
  info = {"checkpoint": "c", "step": 3, "data": "task:x"}
  one = evaluate.Report(info, rows, [], [], None, None)
  assert not evaluate.plot_at_k(one, str(tmp_path / "a.png"))
  rows["n=2, T=1"] = {
    f"{m}@{k}": (0.5, 0.25, 0.75) for m in ("pass", "mean") for k in (1, 2)
  }
  assert evaluate.plot_at_k(one, str(tmp_path / "b.png"))
  assert not (tmp_path / "a.png").exists() and (tmp_path / "b.png").exists()


def test_config_fields_become_flags():
  for f in dataclasses.fields(evaluate_cli.Config):
    assert type(f.default) in (bool, int, float, str), f.name


@pytest.mark.parametrize(
  "flags, message",
  [
    (dict(samples=0), "--samples=0 must be >= 1"),
    (dict(samples=4, ks="1,8"), "--ks=1,8: each k must be in 1..--samples=4"),
    (dict(ks="1,x"), "--ks='1,x': expected integers"),
    (dict(data="task:nosuch"), "task:nosuch: unknown task 'nosuch'"),
    (dict(data="/no/such.jsonl"), "/no/such.jsonl: no such file"),
    (dict(template="zzz"), "--template='zzz'; expected '' (the run's) or"),
    (dict(num_problems=-5), "--num_problems=-5 must be >= -1"),
    (dict(max_new_tokens=-3), "--max_new_tokens=-3 must be >= 0"),
    (dict(temperature=-1.0), "--temperature=-1.0 must be >= 0"),
    (dict(mesh_fsdp=16), "--mesh_fsdp=16 --mesh_tensor=1: Mesh"),
  ],
)
def test_bad_flags_fail_before_the_checkpoint_is_read(
  monkeypatch, flags, message
):
  def tripwire(*args, **kwargs):
    raise AssertionError("the checkpoint was read before the flags")

  monkeypatch.setattr(trained, "load", tripwire)
  cfg = evaluate_cli.Config(checkpoint="tiny", **flags)
  with pytest.raises(
    (config.ConfigError, data_lib.DataError), match=re.escape(message)
  ):
    evaluate_cli.run(cfg)


def test_the_cli_exits_2_on_a_usage_error(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.evaluate",
      f"--checkpoint={tmp_path / 'nope'}",
      "--out=nosuchprotocol://bucket/x",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 2, out.stderr[-2000:]
  assert "error: --out=nosuchprotocol://bucket/x: writing to a bucket" in (
    out.stderr
  )


def test_bad_checkpoints_name_the_path(run, tmp_path):
  cfg, out = run
  missing = str(tmp_path / "nope")
  with pytest.raises(trained.CheckpointError, match=missing):
    trained.load(missing)
  with pytest.raises(trained.CheckpointError, match="--checkpoint"):
    trained.load("")
  with pytest.raises(trained.CheckpointError, match=r"saved steps: \[1, 2\]"):
    trained.load(os.path.join(out["workdir"], "checkpoints", "7"))

  empty = tmp_path / "not_a_run"
  empty.mkdir()
  with pytest.raises(trained.CheckpointError, match="neither an RL workdir"):
    trained.load(str(empty))
  # A run that stopped before its first checkpoint.
  unsaved = str(tmp_path / "unsaved")
  run_info.write_run_info(unsaved, cfg)
  with pytest.raises(trained.CheckpointError, match=f"{unsaved}.*no check"):
    trained.load(unsaved)
  os.makedirs(os.path.join(unsaved, "checkpoints"))
  with pytest.raises(trained.CheckpointError, match="no checkpoints in"):
    trained.load(unsaved)

  # A checkpoint without a recorded run needs --data.
  unrecorded = dataclasses.replace(trained.load(out["workdir"]), recorded=False)
  with pytest.raises(data_lib.DataError, match="--data"):
    evaluate.evaluate(unrecorded)
