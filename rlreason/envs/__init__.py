"""Text environments for multi-turn rollouts (rlreason/envs/multiturn.py).

  env = envs.make("search", seed=0)     # or "python", "calculator"
  obs = env.reset(example)              # example: a data.Example-like record
  res = env.step("search: Ava lives")   # -> StepResult(observation, reward,
                                        #                done, info)

Every environment is procedural and needs no network: `python` and
`calculator` run the action in `envs.sandbox`, `search` retrieves from a
generated knowledge base with a deterministic index (envs/search.py).

Layer 7, envs: imports guidance/ and the layers below it.
"""

from rlreason.envs.base import Env
from rlreason.envs.base import StepResult
from rlreason.envs.base import stop_strings
from rlreason.envs.registry import make
from rlreason.envs.registry import names
from rlreason.envs.registry import register

__all__ = ["Env", "StepResult", "make", "names", "register", "stop_strings"]
