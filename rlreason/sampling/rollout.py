"""Rollouts: G sampled completions for each prompt, as a `types.Rollout`.

  ro = rollout.generate(params, prompts, rng, step, model_cfg=model_cfg,
                        tokenizer=tok, group_size=8, max_new_tokens=512,
                        sampling=sampling.Sampling(temperature=1.0),
                        mesh=mesh, max_prompt_len=512)

`generate` left-pads the prompts on the host (the length rounded up to a
bucket, so varied prompt lengths reuse a few compiled shapes), repeats each
prompt G times, moves the parameters from the training layout to
mesh.ROLLOUT_RULES on the same mesh (replicated over data / fsdp, split over
tensor: no parameter all-gathers while decoding; on the sampler's own
tensor split with --rollout_tensor, mesh.rollout_mesh, its outputs moved
back to the run's mesh), samples with
rng = fold_in(base_rng, step) so that a resumed run replays its samples
(each row with its own key, sampling.row_keys: a row's samples do not
depend on the batch around it), and detokenizes on the host.

At most `rows_per_call` sequences are sampled at once (config
`--rollout_rows`; 0 sizes them from the devices' free memory after the
rollout parameters are placed: rollout_memory.rows_per_call(), from each
sequence's KV cache and working set). With batching="continuous" (the
loop's default, config `--rollout_batching`) and more rows than that, they
are the decode slots of one continuous.sample call, refilled as rows
finish; otherwise the N rows go through the static sampler in calls of that
many, every call padded to one shape so they share one compiled program.
Per-row keys make the samples those of one static call either way. Given
a `journal` directory, the rows are kept there as the calls (or continuous
batching's host calls) finish them (journal.py), and a call that finds
them samples only the others: a stopped rollout's rerun loses only the
rows under way.

Shapes: B prompts, G completions per prompt, N = B * G sequences, P bucketed
prompt length, T = max_new_tokens, V vocab (legend in types.py).
"""

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import mesh as mesh_lib
from rlreason.sampling import continuous
from rlreason.sampling import sampler as sampling_lib
from rlreason.sampling import draw
from rlreason.sampling import journal as journal_lib
from rlreason.sampling import padding
from rlreason.sampling import rollout_layout
from rlreason.sampling import rollout_memory
from rlreason.sampling import stops
from rlreason.model.tokenizer import Tokenizer
from rlreason.model.transformer import ModelConfig
from rlreason.types import Rollout


BATCHING = ("static", "continuous")


def generate(
  params: Any,
  prompts: Sequence[Sequence[int]],
  rng: jax.Array,
  step: int,
  *,
  model_cfg: ModelConfig,
  tokenizer: Tokenizer,
  max_new_tokens: int,
  group_size: int = 1,
  sampling: draw.Sampling | None = None,
  mesh: jax.sharding.Mesh | None = None,
  max_prompt_len: int | None = None,
  bucket: int = 32,
  extra_stop_ids: Sequence[int] = (),
  extra_stop_sequences: Sequence[Sequence[int]] = (),
  row_offset: int = 0,
  rows_per_call: int = 0,
  batching: str = "static",
  compiler_options: dict | None = None,
  progress: Callable[[int], None] | None = None,
  interrupt: Callable[[], None] | None = None,
  journal: str | None = None,
) -> Rollout:
  """Samples `group_size` completions for each prompt.

  Args:
    params: model parameters, in any layout (typically mesh.TRAIN_RULES).
    prompts: B lists of prompt token ids (not padded).
    rng: the run's base key; this call samples with fold_in(rng, step).
    step: the RL step, so that a resumed run replays the same samples.
    model_cfg: the architecture.
    tokenizer: gives pad_id, eos_id and decode().
    max_new_tokens: T.
    group_size: G completions per prompt.
    sampling: temperature and filters; None is Sampling() (temperature 1,
      no filters).
    mesh: sample on this mesh in the rollout layout (regrouped to
      model_cfg.rollout_tensor: rollout_layout.sampling_mesh; the outputs
      on `mesh`); None keeps the parameters where they are and the batch
      on the default device.
    max_prompt_len: the prompt budget (error when exceeded); also caps P.
    bucket: P is the longest prompt rounded up to a multiple of this.
    extra_stop_ids: ids that end a completion besides tokenizer.eos_id.
    extra_stop_sequences: token-id sequences that end a completion once
      its last tokens equal one (stops.token_sequences(tokenizer, strings)
      for stop strings; only this token test, no host-side text check).
    row_offset: the global index of this call's first row: row i samples
      with its own key (sampling.row_keys), so prompts sampled in chunks
      with offsets = the rows before them get the samples of one call.
    rows_per_call: sequences per sampler call; the N rows are sampled in
      calls of this many (the last one padded to the same shape), with the
      samples of one call. 0: as many as the devices' free memory holds
      (rollout_memory.rows_per_call()), or all N where the backend reports
      no memory; an error when more than the free memory holds.
    batching: "static" (calls of rows_per_call rows, each decoded until its
      longest row stops) or "continuous" (rows_per_call decode slots
      refilled as rows finish: sampling/continuous.py; the static path
      where all N rows fit in one call).
    compiler_options: the sampler's compile options (e.g. libtpu's
      temporaries budget, --rollout_temp_budget_mib); None: defaults.
    progress: called with the number of rows sampled so far while the
      rollout is under way: after each sampler call but the last (the
      static calls then run one at a time: the host waits for each, as
      with `interrupt`) and within a call every engine.PROGRESS_STEPS
      decode steps (sampler.sample, continuous.sample); never at the end.
    interrupt: called where the rollout may be abandoned: between sampler
      calls, and between continuous batching's host calls (those of
      `progress`); it raises to stop there (the loop's
      preemption.Preemption.interrupt). Every process calls it at the same
      points.
    journal: a local directory, this `params`' own, that keeps the rows
      as they finish (after each static call, or continuous batching's
      host calls: the points of `interrupt`, and at the end), in
      journal.RowJournal's files named by everything else the samples
      depend on. A call that finds rows kept there samples only the
      others, with their own keys: a stopped rollout's rerun loses at
      most the rows under way, and one that ended (a stop in the work
      after it) none. The caller removes it once the rollout is used.
      Process 0 reads and writes it.

  Returns:
    A types.Rollout with N = B * G rows, each group of G contiguous.

  Raises:
    ValueError: on bad prompts or arguments, before any device work.
  """
  if group_size < 1:
    raise ValueError(f"group_size={group_size} must be >= 1")
  if batching not in BATCHING:
    raise ValueError(f"batching={batching!r}; expected one of {BATCHING}")
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
  v = model_cfg.vocab_size
  stop_ids, stop_sequences = stops.split(
    (tokenizer.eos_id, *extra_stop_ids), extra_stop_sequences
  )
  stops.check_vocab(stop_ids, stop_sequences, v, name="model vocabulary")
  for i, ids in enumerate(prompts):
    if len(ids) and not 0 <= min(ids) <= max(ids) < v:
      raise ValueError(
        f"Prompt {i} has token ids outside the model vocabulary [0, {v})"
      )
  tokens, positions = padding.pad_prompts(
    prompts, tokenizer.pad_id, max_len=max_prompt_len, bucket=bucket
  )
  b, p = tokens.shape
  tokens = np.repeat(tokens, group_size, axis=0)  # [N, P]
  positions = np.repeat(positions, group_size, axis=0)
  prompt_ids = np.repeat(np.arange(b), group_size)  # [N]

  run_mesh, mesh = mesh, rollout_layout.sampling_mesh(mesh, model_cfg)
  scalars = (rng, np.asarray(step, np.uint32))
  if mesh is None:
    rng, step = jax.device_put(scalars)
  else:
    params = rollout_layout.to_layout(params, mesh, model_cfg)
    rng, step = mesh_lib.put_global(scalars, mesh_lib.replicated(mesh))
  per_call = rollout_memory.call_rows(
    rows_per_call,
    len(tokens),
    model_cfg,
    p,
    int(max_new_tokens),
    mesh,
    params,
    batching,
  )
  n = len(tokens)
  rows_journal, held_ids, held = None, np.zeros((0,), np.int64), None
  if journal:
    rows_journal = journal_lib.RowJournal(
      journal,
      journal_lib.rollout_setting(
        tokens, positions, rng, step, model_cfg, max_new_tokens, sampling,
        stop_ids, stop_sequences, tokenizer.pad_id, row_offset,
      ),
    )  # fmt: skip
    held_ids, held = rows_journal.read(n, int(max_new_tokens))
  todo = np.setdiff1d(np.arange(n), held_ids)  # all rows but those kept
  resumed = len(todo) < n
  # With a journal, every row's host copy, (row ids, {field: rows}) a part,
  # of the fields the end needs: the texts', or all to place the rows.
  on_host = [] if held is None else [(held_ids, held)]
  needed = journal_lib.FIELDS if resumed else ("tokens", "lengths", "finish")

  def keep(ids, out):  # a finished part's rows (host), in the journal
    rows_journal.write(todo[ids], out)
    on_host.append((todo[ids], {k: getattr(out, k) for k in needed}))

  def ids_of(part):  # the rows' keys: the first's offset, or each row's
    return row_offset + part if resumed else row_offset + int(part[0])

  def report(done):  # rows sampled so far, the kept ones included
    if progress is not None:
      progress(len(held_ids) + done)

  call = functools.partial(
    _sample_rows,
    params,
    rng=jax.random.fold_in(rng, step),
    model_cfg=model_cfg,
    max_new_tokens=int(max_new_tokens),
    sampling=sampling or draw.Sampling(),
    stop_ids=stop_ids,
    pad_id=tokenizer.pad_id,
    mesh=mesh,
    stop_sequences=stop_sequences,
    compiler_options=compiler_options,
  )
  out, m = None, len(todo)
  if not m:
    pass  # every row was kept
  elif batching == "continuous" and per_call < m:
    out = call(tokens[todo], positions[todo], rows=m,
               row_offset=ids_of(todo), slots=per_call,
               progress=report if progress else None, interrupt=interrupt,
               on_rows=keep if rows_journal else None)  # fmt: skip
  else:
    outs = []
    for lo in range(0, m, per_call):
      part = todo[lo : lo + per_call]
      within = None
      if progress is not None:  # rows done within the call, as rollout's
        within = offset_progress(report, lo, len(part))
      outs.append(
        call(
          tokens[part],
          positions[part],
          rows=per_call,
          row_offset=ids_of(part),
          progress=within,
        )
      )
      if rows_journal is not None:  # waits for the call; no mask kept
        done = mesh_lib.to_host(outs[-1]._replace(mask=None))
        keep(np.arange(lo, lo + len(part)), done)
      if lo + per_call < m and (progress or interrupt):
        jax.block_until_ready(outs[-1].lengths)  # one call at a time
        report(lo + per_call)
        if interrupt is not None:
          interrupt()
    out = (
      outs[0]
      if len(outs) == 1
      else jax.tree.map(lambda *xs: jnp.concatenate(xs), *outs)
    )
  host = None
  if rows_journal is not None:  # every row is on the host already
    host = journal_lib.in_row_order(n, on_host)
    if resumed:  # the kept rows and the new ones, in row order
      out = _on_device(mesh, host)
  tokens, positions = _put_rows(mesh, (tokens, positions))
  full_tokens, full_positions = _concat_completion(
    tokens, positions, out.tokens, out.mask
  )
  logp, policy_logp, mask = out.logp, out.policy_logp, out.mask
  if mesh is not run_mesh:  # the sampler's own mesh: rows back to the run's
    full_tokens, full_positions, logp, policy_logp, mask = mesh_lib.put_rows(
      run_mesh, (full_tokens, full_positions, logp, policy_logp, mask)
    )

  if host is None:  # device -> host, for detokenizing and rewards
    fields = ("tokens", "lengths", "finish")
    host = mesh_lib.to_host({k: getattr(out, k) for k in fields})
  completions, lengths, finish = host["tokens"], host["lengths"], host["finish"]
  texts = [
    tokenizer.decode(row[:n].tolist())
    for row, n in zip(completions, lengths, strict=True)
  ]
  reasons = np.asarray(sampling_lib.FINISH_REASONS)[finish]
  return Rollout(
    tokens=full_tokens,
    positions=full_positions,
    prompt_len=p,
    logp=logp,
    policy_logp=policy_logp,
    mask=mask,
    lengths=np.asarray(lengths),
    finish_reasons=reasons,
    texts=texts,
    prompt_ids=prompt_ids,
  )


def _on_device(mesh, rows) -> sampling_lib.SampleOutput:
  """Host rows (journal.in_row_order) as a SampleOutput on `mesh` in the rollout
  layout, the mask given by the lengths."""
  width = rows["tokens"].shape[1]
  mask = (np.arange(width) < rows["lengths"][:, None]).astype(np.int32)
  return sampling_lib.SampleOutput(**_put_rows(mesh, {**rows, "mask": mask}))


def _put_rows(mesh, tree):
  """Host [N, ...] arrays -> device, split by rows in the rollout layout."""
  if mesh is None:
    return jax.device_put(tree)

  def put(x):  # every process holds the same global rows, places its own
    axes = ("batch",) + (None,) * (np.ndim(x) - 1)
    spec = mesh_lib.spec(axes, mesh_lib.ROLLOUT_RULES, np.shape(x), mesh)
    return mesh_lib.put_global(x, jax.sharding.NamedSharding(mesh, spec))

  return jax.tree.map(put, tree)


def _sample_rows(
  params,
  tokens,
  positions,
  *,
  rows,
  row_offset,
  rng,
  mesh,
  slots=0,
  progress=None,
  interrupt=None,
  on_rows=None,
  **kwargs,
) -> sampling_lib.SampleOutput:
  """One sampler call on host rows [n <= rows, P], padded to `rows` rows
  (copies of the last) so that every call of a chunked rollout shares one
  compiled program; outputs cut back to n. slots > 0: continuous batching
  over that many decode slots. `progress` gets the rows finished during
  the call (sampler.sample, continuous.sample); `interrupt` and `on_rows`,
  continuous batching's (between its host calls). row_offset: the first
  row's global index, or each row's [n]."""
  n = len(tokens)
  offset = np.asarray(row_offset, np.uint32)  # [] or each row's [n]
  if n < rows:
    fill = np.repeat(np.arange(n - 1, n), rows - n)
    tokens = np.concatenate([tokens, tokens[fill]])
    positions = np.concatenate([positions, positions[fill]])
    if offset.ndim:
      offset = np.concatenate([offset, offset[fill]])
  tokens, positions = _put_rows(mesh, (tokens, positions))
  if mesh is None:
    offset = jax.device_put(offset)
  else:
    offset = mesh_lib.put_global(offset, mesh_lib.replicated(mesh))
  fn = functools.partial(sampling_lib.sample, progress=progress)
  if slots:
    fn = functools.partial(
      continuous.sample,
      slots=slots,
      progress=progress,
      interrupt=interrupt,
      on_rows=on_rows,
    )
  out = fn(
    params, tokens, positions, rng, mesh=mesh, row_offset=offset, **kwargs
  )
  if n < rows:
    out = jax.tree.map(lambda x: x[:n], out)
  return out


def offset_progress(progress, lo: int, rows: int) -> Callable[[int], None]:
  """A call's progress (rows finished of its `rows`, padding copies
  included) as the rollout's: rows done so far, the call's first being
  row `lo` (multi-turn episodes' calls too)."""
  return lambda done: progress(lo + min(done, rows))


@jax.jit
def _concat_completion(tokens, positions, completion, mask):
  """Prompt [N, P] + completion [N, T] -> tokens, positions [N, P + T].

  Completion t sits at position (prompt length) + t; tokens after the stop
  token are padding (position -1).
  """
  t = completion.shape[1]
  start = positions[:, -1:] + 1  # [N, 1]: real prompt tokens
  completion_pos = jnp.where(mask > 0, start + jnp.arange(t)[None, :], -1)
  return (
    jnp.concatenate([tokens, completion], axis=1),
    jnp.concatenate([positions, completion_pos.astype(jnp.int32)], axis=1),
  )
