"""The generative judge (rewards/judge.py): verdicts sampled through the
sampler, and as a reward beside the verifiable ones."""

import jax
import numpy as np

from rlreason import rewards
from rlreason import testing
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.rewards import judge

CFG = testing.tiny_model_config()
TOK = tokenizer_lib.CharTokenizer()


def test_parse_verdict():
  assert judge.parse_verdict(" Yes, it is") == 1.0
  assert judge.parse_verdict("no") == 0.0
  assert judge.parse_verdict("score: 7") == 0.7


def test_generative_judge_samples_through_the_sampler():
  params = transformer.init(CFG, jax.random.key(0))
  r, texts = judge.judge(
    params,
    ["1+1?", "2+2?"],
    ["2", "5"],
    jax.random.key(0),
    model_cfg=CFG,
    tokenizer=TOK,
    max_new_tokens=3,
  )
  assert r.shape == (2,) and len(texts) == 2
  assert set(np.unique(r)) <= {0.0, 1.0}
  np.testing.assert_array_equal(r, [judge.parse_verdict(t) for t in texts])


def test_judge_fn_is_the_judges_reward_beside_verifiable_ones():
  """rewards.combine with judge_fn: its part is judge()'s mean verdicts
  for the questions and completions (the answers unused), its weight
  applied in the total."""
  params = transformer.init(CFG, jax.random.key(0))
  kw = dict(model_cfg=CFG, tokenizer=TOK, max_new_tokens=3, samples=2)
  fn = rewards.combine(
    {"exact_match": 1.0, "judge": 0.5},
    fns={"judge": judge.judge_fn(params, seed=3, temperature=1.0, **kw)},
  )
  questions, completions = ["1+1?", "2+2?"], ["2", "5"]
  total, parts = fn(completions, ["2", "4"], questions=questions)
  want, _ = judge.judge(
    params, questions, completions, jax.random.key(3), temperature=1.0, **kw
  )
  assert set(np.unique(want * 2)) <= {0.0, 1.0, 2.0}
  np.testing.assert_allclose(parts["judge"], want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(
    total, parts["exact_match"] + 0.5 * want, rtol=1e-6, atol=1e-6
  )


def test_prompt_len_bounds_a_judges_prompt():
  """The planner's bound on the judge's prompt: question and response
  tokens + the template's characters (74; at most a token each), to the
  sampler's bucket of 32; a character tokenizer's prompt of a 10-token
  question and 20-token response fits it."""
  assert judge.prompt_len(10, 20) == 128  # 10 + 20 + 74 = 104 -> 128
  assert judge.prompt_len(0, 22) == 96
  text = judge.JUDGE_TEMPLATE.format(question="q" * 10, response="r" * 20)
  assert len(TOK.encode(text)) == 104 <= judge.prompt_len(10, 20)
