"""Seconds a plan's collectives take on the inter-chip links per RL step.

  seconds = ici.ici_times(cfg, programs, ici_bandwidth)

Each compiled program's bytes sent per device (Program.ici_bytes, every
loop multiplied out; plan/hlo_loops.py) times its calls per RL step, at
half the chip's bidirectional ICI bandwidth (all links at once,
overlapped with compute: a bound). plan/summary.py's step times are at
least these.
"""

from rlreason.sampling import tree_loop


def sampler_calls(cfg, rows, decode_tokens=0) -> tuple[int, int]:
  """(calls, decode steps per call) of a sampler taking `rows` of cfg's
  N rows per call (0: all at once): each call decodes T steps, or the
  decoded tokens of multi-turn episodes (decode_tokens, the rest
  prefilled); a tree call (sampling/tree_loop.py) decodes its rounds
  of T in sequence, rows // per_prompt prompts per call. The roofline
  (summary._sampling_seconds) and the ICI bound (_sampler_ici) count
  with it."""
  n, t = cfg.num_sequences, cfg.max_new_tokens
  tree = tree_loop.call_shape(cfg)
  if tree:
    per_prompt, _, rounds = tree
    return -(-(n // cfg.group_size) // max(rows // per_prompt, 1)), rounds * t
  decoded = min(decode_tokens, t) if decode_tokens > 0 else t
  return (-(-n // rows) if rows else 1), decoded


def _sampler_ici(cfg, prog, decode_tokens=0) -> float:
  """Bytes a sampler program's collectives send per RL step for cfg's N
  rows: its decode loop's (Program.ici_unread: a loop that stops when
  every row has, counted once in the HLO) times the decode steps
  (sampler_calls), the rest (the prefill) once per call of `rows`
  rows. A continuous-batching program is one call over the N rows
  through `rows` slots: its refills' (Program.ici_refill, a prefill of
  refill_rows prompts each) times the refills it runs (Program.refills),
  its decode steps' as `calls` calls' would be, the rest once."""
  calls, decoded = sampler_calls(cfg, prog.rows, decode_tokens)
  fixed = prog.ici_bytes - prog.ici_unread - prog.ici_refill
  if prog.refills:
    return (
      fixed + prog.refills * prog.ici_refill + calls * decoded * prog.ici_unread
    )
  return calls * (fixed + decoded * prog.ici_unread)


def ici_times(
  cfg, programs, ici_bandwidth, score_forwards=0, decode_tokens=0
) -> dict:
  """Seconds per RL step each program's collectives take on the ICI,
  sent at half the bidirectional bandwidth (all links at once): the
  train step's bytes (Program.ici_bytes) per minibatch and epoch, a
  sampler's per decode step and call (_sampler_ici), a forward's per
  call of its rows; {} without a bandwidth."""
  if not ici_bandwidth:
    return {}
  rate = ici_bandwidth / 2
  out = {}
  for name, prog in programs.items():
    if name == "reward_model_train" or not prog.ici_bytes:
      continue  # before the RL steps (before_rl)
    if name == "train_step":
      sent = prog.ici_bytes * cfg.ppo_epochs * cfg.minibatches
    elif prog.calls:  # a critic's own updates (critic_step)
      sent = prog.ici_bytes * prog.calls
    elif name == "rollout":
      sent = _sampler_ici(cfg, prog, decode_tokens)
    elif prog.sampled:
      sampler_cfg, _, models = prog.sampled
      sent = models * _sampler_ici(sampler_cfg, prog)
    else:  # a forward over `rows` of the N rows per call
      sent = prog.ici_bytes * (
        -(-cfg.num_sequences // prog.rows) if prog.rows else 1
      )
    out[name] = sent / rate
  if score_forwards and "ref_logp" in out:
    out["scores"] = score_forwards * out["ref_logp"]
  return out
