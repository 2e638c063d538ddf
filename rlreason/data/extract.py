"""Final-answer extraction from model completions (host side, linear time).

Completions can be hostile (1 MB strings, thousands of unclosed tags), so
everything here is a bounded scan with str.find / str.rfind; no regular
expression with backtracking runs over a whole completion.
"""

_OPEN_TAG, _CLOSE_TAG = "<answer>", "</answer>"
_BOXED = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
  r"""Content of the last `\boxed{...}` (or `\fbox{...}`), braces balanced.

  `\boxed 5` (no braces) yields the token after the space. Returns None when
  there is no box or the last box is unbalanced.
  """
  start = max(text.rfind(b) for b in _BOXED)
  if start < 0:
    return None
  i = start + (6 if text.startswith("\\boxed", start) else 5)
  if i < len(text) and text[i] == " ":
    end = i + 1
    while end < len(text) and text[end] not in " \n$":
      end += 1
    return text[i + 1 : end] or None
  if i >= len(text) or text[i] != "{":
    return None
  depth = 0
  for j in range(i, len(text)):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        return text[i + 1 : j]
  return None


def answer_tag(text: str) -> str | None:
  """Stripped content of the last `<answer>...</answer>`, or None."""
  end = text.rfind(_CLOSE_TAG)
  if end < 0:
    return None
  start = text.rfind(_OPEN_TAG, 0, end)
  if start < 0:
    return None
  return text[start + len(_OPEN_TAG) : end].strip()


def answer_line(text: str) -> str | None:
  """Value of a final `Answer: ...` line (any case; DAPO / our tasks)."""
  text = text.rstrip()
  line = text[text.rfind("\n") + 1 :].strip()
  if line[:7].lower() != "answer:":
    return None
  return line[7:].strip() or None


def extract(text: str) -> str | None:
  r"""The final answer of a completion, or None.

  Order: the last `<answer>` tag (its `\boxed{}` content if it has one), else
  the last `\boxed{}`, else a final `Answer: ...` line.
  """
  tagged = answer_tag(text)
  if tagged is not None:
    boxed = last_boxed(tagged)
    return boxed if boxed is not None else (tagged or None)
  boxed = last_boxed(text)
  if boxed is not None:
    return boxed
  return answer_line(text)


def normalize(answer: str) -> str:
  r"""Light textual normalisation for exact match and voting.

  Strips spaces, surrounding `$`, a trailing period, `\left`/`\right`,
  `\!`, `\,` and `\text{...}` wrappers, and maps `\dfrac`/`\tfrac` to
  `\frac`. It does not decide mathematical equivalence (see rewards.math).
  """
  s = answer.strip().strip("$").strip()
  s = s.rstrip(".")
  for old, new in (
    ("\\left", ""),
    ("\\right", ""),
    ("\\!", ""),
    ("\\,", ""),
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
  ):
    s = s.replace(old, new)
  if s.startswith("\\text{") and s.endswith("}"):
    s = s[6:-1]
  return "".join(s.split())


def nesting_depth(text: str) -> int:
  """Maximum nesting depth of (), [] and {} (unbalanced closers ignored)."""
  depth = best = 0
  for c in text:
    if c in "([{":
      depth += 1
      best = max(best, depth)
    elif c in ")]}" and depth:
      depth -= 1
  return best
