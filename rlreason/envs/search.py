"""A simulated search engine over a generated knowledge base (SearchGym spirit).

SearchGym (arXiv:2601.14615) trains search agents against a generated,
verifiable knowledge graph and its aligned corpus instead of a live engine.
Here: a seeded world of people, cities and countries; each fact is one
document; every question is answerable from the corpus by construction
(1 hop: "Where does X live?"; 2 hops: "In which country does X live?",
which needs the city first).

Retrieval is a deterministic inverted index: documents are ranked by the
number of distinct query words they contain, ties by document id; the top
`top_k` are returned as `result: <doc> <doc>\n`.

Task `kbqa` (registered by `register_task()`): prompts, gold answers and
reference solutions that use the search tool, e.g.

  Q: Where does Ava Tor live?
  search: Ava Tor lives
  result: Ava Tor lives in Rome.
  answer: Rome
"""

import dataclasses
import functools
import random
import re

from rlreason.data import tasks
from rlreason.envs import base as env_base
from rlreason.data.tasks import base as task_base

_FIRST = (
  "Ava Ben Cai Dan Eli Fay Gus Hal Ida Jon Kai Lea Max Ned Ola Pia Quin Rex "
  "Sam Tia Uma Vic Wes Xia Yan Zoe"
).split()
_LAST = (
  "Tor Lund Mar Vey Sol Kim Ruiz Oak Penn Reed Moss Hale Cruz Fox Bell Cole "
  "Dale Finn Gray Hart Ives Jain Kerr Lowe Mohr Nash Orr Pike Rios Shaw Tate "
  "Udal Vance Ward Yates Zorn Abel Bose Cato Diaz"
).split()
_CITIES = (
  "Rome Oslo Lima Kyiv Pune Doha Baku Riga Cork Nice Graz Bern Lyon Kobe "
  "Fez Ufa"
).split()
_COUNTRIES = "Italy Norway Peru Chile Japan Spain Kenya Nepal".split()
_JOBS = "baker pilot nurse judge miner poet tailor chef".split()
_WORD = re.compile(r"[a-z0-9]+")


@dataclasses.dataclass(frozen=True)
class World:
  """people: name -> (city, job); cities: city -> country; docs: facts."""

  people: dict
  cities: dict
  docs: tuple[str, ...]


@functools.lru_cache(maxsize=4)
def world(seed: int = 0) -> World:
  """The knowledge base, a pure function of `seed`."""
  rng = random.Random(f"kbqa-world/{seed}")
  cities = {c: rng.choice(_COUNTRIES) for c in _CITIES}
  people = {
    f"{f} {l}": (rng.choice(_CITIES), rng.choice(_JOBS))
    for f in _FIRST
    for l in _LAST
  }
  docs = [f"{p} lives in {c}." for p, (c, _) in people.items()]
  docs += [f"{p} works as a {j}." for p, (_, j) in people.items()]
  docs += [f"{c} is in {k}." for c, k in cities.items()]
  return World(people, cities, tuple(docs))


class Index:
  """Deterministic bag-of-words retrieval over `docs`."""

  def __init__(self, docs):
    self.docs = tuple(docs)
    self._postings: dict[str, list[int]] = {}
    for i, d in enumerate(self.docs):
      for w in set(_WORD.findall(d.lower())):
        self._postings.setdefault(w, []).append(i)

  def search(self, query: str, top_k: int = 1) -> list[str]:
    """Top `top_k` documents by distinct query-word hits (ties: doc id)."""
    hits: dict[int, int] = {}
    for w in set(_WORD.findall(query.lower())):
      for i in self._postings.get(w, ()):
        hits[i] = hits.get(i, 0) + 1
    ranked = sorted(hits, key=lambda i: (-hits[i], i))
    return [self.docs[i] for i in ranked[:top_k]]


@functools.lru_cache(maxsize=4)
def index(seed: int = 0) -> Index:
  return Index(world(seed).docs)


class SearchEnv(env_base.ToolEnv):
  """`search: <query>` -> `result: <top docs>`; `answer: <value>` ends it."""

  def __init__(self, *, seed: int = 0, top_k: int = 1, **kwargs):
    kwargs.setdefault("max_obs_chars", 80)
    super().__init__(tool="python", **kwargs)
    self.tool, self.index, self.top_k = "search", index(seed), top_k

  def step(self, action: str) -> env_base.StepResult:
    self.transcript += action
    call = env_base.parse_action(action, ("search", "answer"))
    if call is None or call[0] == "answer":
      reward = self.verify(self.transcript, self.gold)
      return env_base.StepResult("", reward, True, {"tool": None})
    docs = self.index.search(call[1], self.top_k)
    text = " ".join(docs)[: self.max_obs_chars] or "nothing found"
    obs = ("" if action.endswith("\n") else "\n") + f"result: {text}\n"
    self.transcript += obs
    return env_base.StepResult(
      obs, self.tool_reward, False, {"tool": "search", "docs": docs}
    )


class KBQA(task_base.Task):
  """Questions over `world(0)`, answered with the search tool.

  Difficulty 1: where a person lives (1 search). Difficulty 2: the country
  a person lives in (2 searches: person -> city -> country).
  """

  name = "kbqa"
  max_difficulty = 2

  def _generate(self, rng, difficulty):
    w = world(0)
    person = rng.choice(sorted(w.people))
    city = w.people[person][0]
    first = f"search: {person} lives\nresult: {person} lives in {city}.\n"
    if difficulty == 1:
      prompt = f"Q: Where does {person} live?\n"
      return prompt, city, first + f"answer: {city}", (first,)
    country = w.cities[city]
    second = f"search: {city} is in\nresult: {city} is in {country}.\n"
    prompt = f"Q: In which country does {person} live?\n"
    solution = first + second + f"answer: {country}"
    return prompt, country, solution, (first, second)

  def check(self, value: str, answer: str) -> bool:
    return value == answer


def register_task() -> None:
  """Adds task `kbqa` to the task registry (idempotent)."""
  if "kbqa" not in tasks.names():
    tasks.register(KBQA())
