"""Stop conditions of the decode loops: stop ids and stop token sequences.

  seqs = stops.token_sequences(tok, ["</search>", "</answer>"])
  out = sampling.sample(..., stop_ids=(tok.eos_id,), stop_sequences=seqs)

A row is done after the step that emits token x_t when

  x_t in stop_ids                                  (one id: EOS, "\\n", ...)
  or (x_{t-k_s+1}, ..., x_t) == s  for some s in stop_sequences,  k_s = |s|

where only tokens emitted by this decode call count (a sequence never
matches across the prompt boundary). Both loops (sampling.sample and
segments.decode) call `check` once per step, inside the jitted while_loop.

Stop sequences: the static tuple is padded into a right-aligned table
[S, k], k = max_s k_s, with a validity mask; the loop carries each row's
last k - 1 emitted tokens (`window`, -1 before the first emission: -1 is
no token id, so a sequence longer than what was emitted cannot match).
Per step, with w = [window, x_t] in [N, k]:

  match[n] = any_s all_j (~valid[s, j] | w[n, j] == table[s, j])

a [N, S, k] comparison, negligible next to the model's decode step. With
no multi-token sequence the window is None and the check is the single-id
test alone, so that path compiles to the same program as before.

Strings: `token_sequences(tokenizer, strings)` turns stop strings into the
token ids that end with them, from the tokenizer's own encodings of the
string (and of the string after a space, which BPE vocabularies often merge
into one token such as "Ġ</"). Limitation: a BPE model can write the same
text with another split (e.g. "x</" merged with the text before it); the
device check then misses it. multiturn.generate also finds stop strings in
the decoded action on the host and cuts the action there (segments.rewind
hides the extra tokens from the cache); sampling.sample and rollout.generate
do not.

Shapes: N rows, S stop sequences, k longest stop sequence.
"""

from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

StopIds = tuple[int, ...]
StopSequences = tuple[tuple[int, ...], ...]


def split(
  stop_ids: Iterable[int] = (), stop_sequences: Iterable[Sequence[int]] = ()
) -> tuple[StopIds, StopSequences]:
  """Canonical static stop arguments.

  Length-1 sequences join the ids (the single-id fast path); duplicates are
  dropped, first occurrence kept.

  Returns:
    (stop_ids, stop_sequences): ints, and tuples of >= 2 ints.

  Raises:
    ValueError: an empty stop sequence.
  """
  ids = [int(i) for i in stop_ids]
  seqs = []
  for s in stop_sequences:
    s = tuple(int(i) for i in s)
    if not s:
      raise ValueError("Empty stop sequence: every sequence needs a token")
    if len(s) == 1:
      ids.append(s[0])
    else:
      seqs.append(s)
  return tuple(dict.fromkeys(ids)), tuple(dict.fromkeys(seqs))


def check_vocab(
  stop_ids: StopIds,
  stop_sequences: StopSequences,
  vocab_size: int,
  name: str = "vocabulary",
) -> None:
  """Raises ValueError if a stop id is outside [0, vocab_size)."""
  ids = set(stop_ids).union(*map(set, stop_sequences))
  bad = sorted(i for i in ids if not 0 <= i < vocab_size)
  if bad:
    raise ValueError(f"stop ids {bad} are outside the {name} [0, {vocab_size})")


def table(stop_sequences: StopSequences) -> tuple[np.ndarray, np.ndarray]:
  """Right-aligned [S, k] int32 table and its [S, k] validity mask."""
  k = max(map(len, stop_sequences))
  tab = np.full((len(stop_sequences), k), -1, np.int32)
  valid = np.zeros((len(stop_sequences), k), bool)
  for i, s in enumerate(stop_sequences):
    tab[i, k - len(s) :] = s
    valid[i, k - len(s) :] = True
  return tab, valid


def init_window(n: int, stop_sequences: StopSequences) -> jax.Array | None:
  """The loop carry: [N, k - 1] of -1, or None without stop sequences."""
  if not stop_sequences:
    return None
  k = max(map(len, stop_sequences))
  return jnp.full((n, k - 1), -1, jnp.int32)


def check(
  tokens: jax.Array,
  window: jax.Array | None,
  stop_ids: StopIds,
  stop_sequences: StopSequences,
) -> tuple[jax.Array, jax.Array | None]:
  """Whether each row's newest token ends a stop; the updated window.

  Args:
    tokens: [N] int32, the token each row emitted this step.
    window: [N, k - 1] the row's previous emitted tokens (oldest first), or
      None when there are no stop sequences.
    stop_ids, stop_sequences: static, as returned by `split`.

  Returns:
    hit [N] bool, and the window shifted by one with `tokens` appended.
  """
  hit = jnp.zeros(tokens.shape, bool)
  if stop_ids:
    ids = jnp.asarray(stop_ids, jnp.int32)
    hit = jnp.any(tokens[:, None] == ids[None, :], axis=-1)
  if window is None:
    return hit, None
  tab, valid = table(stop_sequences)
  recent = jnp.concatenate([window, tokens[:, None]], axis=1)  # [N, k]
  same = (recent[:, None, :] == jnp.asarray(tab)[None]) | ~valid[None]
  hit = hit | jnp.any(jnp.all(same, axis=-1), axis=-1)
  return hit, recent[:, 1:]


def token_sequences(
  tokenizer, strings: Iterable[str], prefixes: Sequence[str] = ("", " ")
) -> StopSequences:
  """Token-id sequences whose text ends with one of the stop `strings`.

  For each string s and prefix c, the shortest suffix of
  tokenizer.encode(c + s) whose decoding still ends with s. With a char
  tokenizer this is encode(s); with BPE it adds the merged forms, e.g.
  encode(" </search>") = ["Ġ</", "search", ">"] beside
  ["</", "search", ">"]. Splits that only occur inside running text are not
  enumerated (see the module docstring).

  Args:
    tokenizer: has encode(text) -> ids and decode(ids) -> text.
    strings: the stop strings (empty ones are skipped).
    prefixes: left contexts to encode each string after.

  Returns:
    Distinct tuples of ids, in the order found; pass through `split`.
  """
  out = []
  for s in strings:
    if not s:
      continue
    for c in prefixes:
      ids = list(tokenizer.encode(c + s))
      if not tokenizer.decode(ids).endswith(s):
        continue  # the tokenizer normalises s away; nothing to match
      j = len(ids) - 1
      while j > 0 and not tokenizer.decode(ids[j:]).endswith(s):
        j -= 1
      out.append(tuple(int(i) for i in ids[j:]))
  return tuple(dict.fromkeys(out))


def first_stop_end(text: str, strings: Iterable[str]) -> int | None:
  """End offset of the earliest stop string in `text`, or None."""
  ends = [text.find(s) + len(s) for s in strings if s and s in text]
  return min(ends) if ends else None


def kept_tokens(tokenizer, ids: np.ndarray, strings: tuple[str, ...]) -> int:
  """How many of sampled `ids` (a multi-turn action) to keep: the fewest
  whose text holds a stop string, or all of them. The host's check of
  strings the tokens spell otherwise than the device's stop sequences; a
  stop only at the very end is the device check's, so one decode of
  ids[:-1] settles the common case."""
  ln = len(ids)
  if not strings or ln <= 1:
    return ln
  if first_stop_end(tokenizer.decode(ids[:-1].tolist()), strings) is None:
    return ln
  lo, hi = 1, ln - 1  # the answer is in [lo, hi]: ids[:hi] has a stop
  while lo < hi:
    mid = (lo + hi) // 2
    text = tokenizer.decode(ids[:mid].tolist())
    if first_stop_end(text, strings) is None:
      lo = mid + 1
    else:
      hi = mid
  return lo
