"""Stop ids and stop sequences: the in-loop check and the string helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.sampling import stops
from rlreason.model import tokenizer as tokenizer_lib


def test_split_folds_single_tokens_into_ids_and_dedupes():
  ids, seqs = stops.split((2, 3, 2), [(5,), [6, 7], (6, 7), (8, 9, 10)])
  assert ids == (2, 3, 5)
  assert seqs == ((6, 7), (8, 9, 10))
  with pytest.raises(ValueError, match="Empty stop sequence"):
    stops.split((), [()])
  with pytest.raises(ValueError, match="outside the vocabulary"):
    stops.check_vocab((1,), ((3, 12),), 10)


def test_table_is_right_aligned():
  tab, valid = stops.table(((5, 6), (7, 8, 9)))
  np.testing.assert_array_equal(tab, [[-1, 5, 6], [7, 8, 9]])
  np.testing.assert_array_equal(valid, [[0, 1, 1], [1, 1, 1]])


@pytest.mark.parametrize("jit", [False, True])
def test_check_hits_exactly_at_the_last_token(jit):
  ids, seqs = (2,), ((5, 6), (7, 8, 9))
  # Rows emit these tokens at steps 0, 1, 2 (columns).
  emitted = np.array(
    [
      [5, 6, 1],  # (5, 6) ends at step 1
      [7, 8, 9],  # (7, 8, 9) ends at step 2
      [6, 5, 6],  # a lone 6 first: (5, 6) ends at step 2 only
      [2, 1, 1],  # stop id at step 0
      [8, 9, 1],  # the tail of (7, 8, 9) without its 7: never
      [9, 7, 8],  # a sequence cut off at the end: never
    ],
    np.int32,
  )
  want = np.array(
    [
      [0, 1, 0],
      [0, 0, 1],
      [0, 0, 1],
      [1, 0, 0],
      [0, 0, 0],
      [0, 0, 0],
    ],
    bool,
  )
  check = lambda t, w: stops.check(t, w, ids, seqs)
  if jit:
    check = jax.jit(check)
  window = stops.init_window(len(emitted), seqs)
  assert window.shape == (6, 2) and (np.asarray(window) == -1).all()
  for t in range(emitted.shape[1]):
    hit, window = check(jnp.asarray(emitted[:, t]), window)
    np.testing.assert_array_equal(hit, want[:, t], err_msg=f"step {t}")
  np.testing.assert_array_equal(window, emitted[:, 1:])
  # Without sequences: no window, the stop-id test alone.
  assert stops.init_window(6, ()) is None
  hit, none = stops.check(jnp.asarray(emitted[:, 0]), None, ids, ())
  assert none is None
  np.testing.assert_array_equal(hit, want[:, 0] & (emitted[:, 0] == 2))


class _LongestMatch:
  """A toy BPE-like tokenizer: greedy longest match over a fixed vocab,
  with merged tokens "</" and " </" (as byte-level BPE's "Ġ</")."""

  VOCAB = {"</": 10, " </": 11, "search": 12, ">": 13, " ": 14, "<": 15}
  VOCAB.update({c: 20 + i for i, c in enumerate("/abcehrs")})

  def encode(self, text):
    out, i = [], 0
    while i < len(text):
      piece = max((p for p in self.VOCAB if text.startswith(p, i)), key=len)
      out.append(self.VOCAB[piece])
      i += len(piece)
    return out

  def decode(self, ids):
    inv = {v: k for k, v in self.VOCAB.items()}
    return "".join(inv[i] for i in ids)


def test_token_sequences_of_stop_strings():
  tok = tokenizer_lib.CharTokenizer()
  # Char ids: "\n" -> 3, then chr(c) -> c - 32 + 4.
  got = stops.token_sequences(tok, ["</a>", "\n", ""])
  assert got == ((60 - 28, 47 - 28, 97 - 28, 62 - 28), (3,))
  bpe = _LongestMatch()
  assert bpe.encode("</search>") == [10, 12, 13]
  # The plain encoding and the space-merged one; after "s" the shortest
  # suffix ending with the string is the plain one again.
  got = stops.token_sequences(bpe, ["</search>"], prefixes=("", " ", "s"))
  assert got == ((10, 12, 13), (11, 12, 13))


def test_first_stop_end():
  assert stops.first_stop_end("ab</s>cd</s>", ["</s>", "cd"]) == 6
  assert stops.first_stop_end("abcd", ["cd", "b"]) == 2
  assert stops.first_stop_end("abcd", ["x", ""]) is None
