"""Host-side batch layout: left-padded prompts and packed training
batches, against hand-written arrays."""

import numpy as np
import pytest

from rlreason.sampling import padding


def test_pad_prompts_left_pads_to_a_bucket():
  tokens, positions = padding.pad_prompts([[5, 6, 7], [9]], pad_id=0, bucket=4)
  np.testing.assert_array_equal(tokens, [[0, 5, 6, 7], [0, 0, 0, 9]])
  np.testing.assert_array_equal(positions, [[-1, 0, 1, 2], [-1, -1, -1, 0]])
  tokens, _ = padding.pad_prompts([[1] * 17], pad_id=0, bucket=16)
  assert tokens.shape == (1, 32)
  tokens, _ = padding.pad_prompts([[1] * 17], pad_id=0, bucket=16, max_len=20)
  assert tokens.shape == (1, 20)  # the bucket is capped by the budget
  tokens, _ = padding.pad_prompts([[1] * 5], pad_id=0, bucket=1)
  assert tokens.shape == (1, 5)


@pytest.mark.parametrize(
  "prompts,max_len,match",
  [
    ([[1, 2], []], None, r"Prompts \[1\] are empty"),
    ([[1] * 9], 8, "more than the prompt budget"),
    ([], None, "No prompts"),
  ],
)
def test_pad_prompts_errors(prompts, max_len, match):
  with pytest.raises(ValueError, match=match):
    padding.pad_prompts(prompts, pad_id=0, max_len=max_len)


def test_pack_lays_prompts_left_and_completions_right():
  """Prompts left-padded to the bucket (32, capped by max_prompt_len=3),
  completions right-padded to max_new_tokens=4 and cut there; completion
  positions go on from the prompt's last."""
  batch = padding.pack([[5, 6], [7]], [[8], [9, 10, 11, 12, 13]], 0, 3, 4)
  np.testing.assert_array_equal(
    batch["tokens"], [[0, 5, 6, 8, 0, 0, 0], [0, 0, 7, 9, 10, 11, 12]]
  )
  np.testing.assert_array_equal(
    batch["positions"],
    [[-1, 0, 1, 2, -1, -1, -1], [-1, -1, 0, 1, 2, 3, 4]],
  )
  np.testing.assert_array_equal(batch["mask"], [[1, 0, 0, 0], [1, 1, 1, 1]])
  assert batch["positions"].dtype == np.int32
  assert batch["mask"].dtype == np.float32


def test_bucketed_lengths():
  assert padding.bucket_length(17, 16) == 32
  assert padding.bucket_length(16, 16) == 16
  assert padding.bucket_length(17, 1) == 17
  assert padding.prompt_length(17, 16, None) == 32
  assert padding.prompt_length(17, 16, 20) == 20
