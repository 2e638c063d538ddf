"""Text environments for multi-turn rollouts (rlreason/multiturn.py).

  env = envs.make("search", seed=0)     # or "python", "calculator"
  obs = env.reset(example)              # example: a data.Example-like record
  res = env.step("search: Ava lives")   # -> StepResult(observation, reward,
                                        #                done, info)

Every environment is procedural and needs no network: `python` and
`calculator` run the action in `envs.sandbox`, `search` retrieves from a
generated knowledge base with a deterministic index (envs/search.py).
"""

from rlreason.envs.base import Env
from rlreason.envs.base import StepResult
from rlreason.envs.base import make
from rlreason.envs.base import names
from rlreason.envs.base import register
from rlreason.envs.base import stop_strings

__all__ = ["Env", "StepResult", "make", "names", "register", "stop_strings"]
