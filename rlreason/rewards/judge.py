"""A generative judge as a reward (LLM-as-a-judge, e.g. RLCF, TIR-Judge,
Think-RM in METHODS.md).

The judge model samples a verdict for a templated question + response
through the policy's sampler (rollout.generate), and the reward is 1.0
when the verdict's first word is `yes` (or a number parsed from
`score: <x>`, scaled to [0, 1]); the mean over `samples` verdicts. It runs
beside the verifiable rewards (`judge_fn` for rewards.combine), as the
scalar reward model of rewards/model.py.
"""

import re
from typing import Any, Sequence

import jax
import numpy as np

from rlreason.sampling import draw as sampling_lib
from rlreason.sampling import rollout as rollout_lib

JUDGE_TEMPLATE = (
  "Question: {question}\nResponse: {response}\n"
  "Is the response correct? Answer yes or no.\nVerdict: "
)
MAX_NEW_TOKENS = 8  # a verdict's tokens (judge's default)


def prompt_len(question_tokens: int, response_tokens: int) -> int:
  """A bound on the judge's prompt length for questions and responses of
  at most these many tokens (the planner's): the template's own text at
  one token per character at most, rounded up to the sampler's bucket
  of 32 (padding.pad_prompts)."""
  own = len(JUDGE_TEMPLATE.format(question="", response=""))
  n = question_tokens + response_tokens + own
  return -(-n // 32) * 32


def parse_verdict(text: str) -> float:
  """1.0 for a leading `yes`, 0.0 otherwise; `score: x` (0-10) -> x / 10."""
  m = re.search(r"score:\s*([0-9]+(?:\.[0-9]+)?)", text)
  if m:
    return float(np.clip(float(m.group(1)) / 10.0, 0.0, 1.0))
  return float(text.strip().lower().startswith("yes"))


def judge(
  params: Any,
  questions: Sequence[str],
  completions: Sequence[str],
  rng: jax.Array,
  *,
  model_cfg,
  tokenizer,
  template: str = JUDGE_TEMPLATE,
  max_new_tokens: int = MAX_NEW_TOKENS,
  samples: int = 1,
  temperature: float = 0.0,
  **generate_kw,
) -> tuple[np.ndarray, list[str]]:
  """Generative judge: the mean verdict of `samples` sampled verdicts.

  `generate_kw` go to rollout.generate: a run's judge samples as its
  policy does (Context.sampler_kwargs: on the run's mesh, in calls of
  --rollout_rows, ...); without them, all rows in one call on the
  default device.

  Returns:
    ([N] rewards in [0, 1], the N * samples verdict texts).
  """
  prompts = [
    tokenizer.encode(template.format(question=q, response=c))
    for q, c in zip(questions, completions, strict=True)
  ]
  ro = rollout_lib.generate(
    params,
    prompts,
    rng,
    0,
    model_cfg=model_cfg,
    tokenizer=tokenizer,
    max_new_tokens=max_new_tokens,
    group_size=samples,
    sampling=sampling_lib.Sampling(temperature=temperature),
    **generate_kw,
  )
  verdicts = np.asarray([parse_verdict(t) for t in ro.texts], np.float32)
  return verdicts.reshape(-1, samples).mean(-1), list(ro.texts)


def judge_fn(params: Any, *, model_cfg, tokenizer, seed: int = 0, **judge_kw):
  """The generative judge as a registry-style reward, for rewards.combine
  beside verifiable rewards: fn(completions, answers=None, *, questions)."""

  def fn(completions, answers=None, *, questions):
    del answers
    rewards, _ = judge(
      params,
      questions,
      completions,
      jax.random.key(seed),
      model_cfg=model_cfg,
      tokenizer=tokenizer,
      **judge_kw,
    )
    return rewards

  return fn
