"""Shortest path length in a small weighted undirected graph.

Prompt: the edges and the query, e.g. `a-b 2, b-c 1, a-c 5. a to c?` plus a
newline. Nodes are lower-case letters.
Solution: Dijkstra's order of settled nodes with their distances (ties by
name), up to the target, then the answer line:

    a=0
    b=2
    c=3
    answer: 3

Answer value: the length of a shortest path, in plain decimal.

Difficulty d: d+2 nodes; more extra edges (so more competing routes) and a
wider weight range as d grows. The graph is connected (a random spanning
tree plus extra edges); the source is `a`, the target a random other node.
"""

import heapq
import re
import string

from rlreason.data.tasks import base

_INT = re.compile(r"0|[1-9][0-9]*")


def distances(edges: dict[tuple[str, str], int], source: str):
  """Dijkstra: (distance per node, order in which nodes were settled)."""
  adj = {}
  for (u, v), w in edges.items():
    adj.setdefault(u, []).append((v, w))
    adj.setdefault(v, []).append((u, w))
  dist, order, heap = {}, [], [(0, source)]
  while heap:
    d, u = heapq.heappop(heap)
    if u in dist:
      continue
    dist[u] = d
    order.append(u)
    for v, w in adj.get(u, ()):
      if v not in dist:
        heapq.heappush(heap, (d + w, v))
  return dist, order


class ShortestPath(base.Task):
  """Length of a shortest path between two nodes."""

  name = "shortest_path"
  max_difficulty = 7

  def _generate(self, rng, difficulty):
    n = difficulty + 2
    nodes = list(string.ascii_lowercase[:n])
    hi = 5 if difficulty <= 2 else 9
    edges = {}
    for i in range(1, n):
      # Random spanning tree: node i joins a random earlier node.
      edges[(nodes[rng.randrange(i)], nodes[i])] = rng.randint(1, hi)
    for _ in range(difficulty):
      u, v = sorted(rng.sample(nodes, 2))
      edges.setdefault((u, v), rng.randint(1, hi))
    target = rng.choice(nodes[1:])
    dist, order = distances(edges, "a")
    edge_list = sorted(edges.items())
    rng.shuffle(edge_list)
    prompt = ", ".join(f"{u}-{v} {w}" for (u, v), w in edge_list)
    prompt += f". a to {target}?\n"
    settled = order[: order.index(target) + 1]
    answer = str(dist[target])
    solution = "\n".join(f"{u}={dist[u]}" for u in settled)
    solution += f"\n{base.ANSWER_PREFIX}{answer}"
    knowledge = ("settle the closest unsettled node first",) + tuple(
      f"distance to {u} is {dist[u]}" for u in settled
    )
    return prompt, answer, solution, knowledge

  def split_key(self, prompt):
    edges, _, query = prompt.partition(". ")
    return ", ".join(sorted(edges.split(", "))) + ". " + query

  def check(self, value, answer):
    return _INT.fullmatch(value) is not None and int(value) == int(answer)
