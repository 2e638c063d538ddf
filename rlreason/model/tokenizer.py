"""Tokenizers behind one interface, and prompt templates.

  tok = tokenizer.load("char")            # built-in, for procedural tasks
  tok = tokenizer.load("/path/to/hf/dir") # HF tokenizer (with chat template)
  ids = tok.encode(tokenizer.apply_template(tok, question, "r1"))

Interface: `vocab_size`, `pad_id`, `eos_id`, `bos_id` (or None),
`encode(text) -> list[int]`, `decode(ids) -> str` (stops nothing, skips
special tokens), `chat(messages) -> str` (the model's chat template),
`char_level` (the built-in character vocabulary, also when loaded from
files `CharTokenizer.save` wrote).

`train_bpe(texts, dir, vocab_size)` learns a byte-level BPE vocabulary from
a corpus and writes it as HF tokenizer files (`experiments.pretrain
--bpe_vocab`).

`CharTokenizer().save(dir)` writes the char tokenizer as HF tokenizer files,
so `load(dir)` reproduces it exactly, reading them without transformers
(`SavedCharTokenizer`); so does `AutoTokenizer`, except beside a model's
config.json, where it picks the model type's own class: use
`PreTrainedTokenizerFast` there, as `HFTokenizer` does.
"""

import functools
import json
import os
import string
import tempfile
from typing import Protocol, Sequence


class Tokenizer(Protocol):
  vocab_size: int
  pad_id: int
  eos_id: int
  bos_id: int | None
  char_level: bool

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...

  def chat(self, messages: list[dict]) -> str: ...


class CharTokenizer:
  """Character-level tokenizer over newline + printable ASCII.

  ids: 0 pad, 1 bos, 2 eos, then one id per character. vocab_size is padded
  to 128 (the "tiny" preset's vocabulary).
  """

  ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
  pad_id, bos_id, eos_id = 0, 1, 2
  _OFFSET = 3
  vocab_size = 128
  char_level = True

  def __init__(self):
    self._ids = {c: i + self._OFFSET for i, c in enumerate(self.ALPHABET)}

  def encode(self, text: str) -> list[int]:
    try:
      return [self._ids[c] for c in text]
    except KeyError as e:
      pos = text.index(e.args[0])
      raise ValueError(
        f"Character {e.args[0]!r} at offset {pos} of {text[:40]!r}... is "
        "not in the built-in char tokenizer's alphabet (newline + printable "
        "ASCII)"
      ) from None

  def decode(self, ids: Sequence[int]) -> str:
    n = len(self.ALPHABET)
    return "".join(
      self.ALPHABET[i - self._OFFSET]
      for i in ids
      if self._OFFSET <= i < self._OFFSET + n
    )

  def chat(self, messages: list[dict]) -> str:
    # No chat format for the built-in tokenizer: plain concatenation.
    return "".join(m["content"] for m in messages)

  def save(self, path: str) -> None:
    """Writes this tokenizer as Hugging Face tokenizer files into `path`.

    tokenizer.json (a WordLevel model over all 128 ids; ids past the
    alphabet are special "<unusedN>" tokens), tokenizer_config.json and
    special_tokens_map.json, so that `AutoTokenizer.from_pretrained(path)`
    and `load(path)` encode and decode exactly like this tokenizer: one
    token per character, nothing added on encode, special and unused ids
    dropped on decode. Text that spells a special token ("<s>") is encoded
    character by character; a character outside the alphabet raises (the
    vocabulary has no unk token).
    """
    import tokenizers  # Only needed to write the files.

    specials = list(SPECIALS)  # pad_id, bos_id, eos_id
    n_used = self._OFFSET + len(self.ALPHABET)
    unused = [f"<unused{i}>" for i in range(self.vocab_size - n_used)]
    vocab = {t: i for i, t in enumerate(specials)}
    vocab.update(self._ids)
    vocab.update({t: n_used + i for i, t in enumerate(unused)})
    assert sorted(vocab.values()) == list(range(self.vocab_size))

    # No unk token: the vocabulary has none, so unknown characters raise.
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(
      tokenizers.Regex(r"[\s\S]"), behavior="isolated"
    )
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(
      [
        tokenizers.AddedToken(t, special=True, normalized=False)
        for t in specials + unused
      ]
    )
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))

    _write_configs(path)


SPECIALS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: pad, bos, eos
MIN_BPE_VOCAB = 256 + len(SPECIALS)  # every byte, then the specials


def _write_configs(path: str) -> None:
  """tokenizer_config.json and special_tokens_map.json for the fast class."""
  special_map = {
    "pad_token": SPECIALS[0],
    "bos_token": SPECIALS[1],
    "eos_token": SPECIALS[2],
  }
  config = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    **special_map,
    "add_bos_token": False,
    "add_eos_token": False,
    # Text like "<s>" is characters, not a special token.
    "split_special_tokens": True,
    "clean_up_tokenization_spaces": False,
  }
  for name, obj in (
    ("tokenizer_config.json", config),
    ("special_tokens_map.json", special_map),
  ):
    with open(os.path.join(path, name), "w") as f:
      json.dump(obj, f, indent=2)
      f.write("\n")


def train_bpe(texts: Sequence[str], path: str, vocab_size: int) -> None:
  """Learns a byte-level BPE vocabulary of `vocab_size` ids from `texts` and
  writes it as HF tokenizer files into `path` (`load(path)` reads them).

  GPT-2's pre-tokenizer (digit runs, letter runs and punctuation runs are
  separate words), so frequent numbers (`56`, `168`) and words (` then`)
  become single tokens and any text still encodes, byte by byte where no
  merge applies. Ids 0, 1, 2 are <pad>, <s>, </s>. Deterministic in the
  texts and their order.
  """
  import tokenizers  # Only needed to train.

  if vocab_size < MIN_BPE_VOCAB:
    raise ValueError(
      f"vocab_size must be >= {MIN_BPE_VOCAB} (bytes + specials), got "
      f"{vocab_size}"
    )
  byte_level = tokenizers.pre_tokenizers.ByteLevel
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = byte_level(add_prefix_space=False, use_regex=True)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=list(SPECIALS),
    initial_alphabet=byte_level.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(texts, trainer)
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  _write_configs(path)


def _tokenizer_class(path: str) -> str | None:
  config = _read_json(os.path.join(path, "tokenizer_config.json"))
  return config.get("tokenizer_class") if isinstance(config, dict) else None


def _read_json(path: str):
  """The file's JSON, or None where it is missing or not JSON."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


class HFTokenizer:
  """A transformers tokenizer loaded from a local directory."""

  def __init__(self, path: str):
    import transformers  # Heavy import, only when a real model is used.

    # A directory CharTokenizer.save wrote names the generic fast class;
    # AutoTokenizer would pick the class of config.json's model_type
    # instead (Qwen2Tokenizer, whose own pre-tokenizer is not ours).
    cls = transformers.AutoTokenizer
    if _tokenizer_class(path) == "PreTrainedTokenizerFast":
      cls = transformers.PreTrainedTokenizerFast
    self._tok = cls.from_pretrained(path, local_files_only=True)
    self.eos_id = self._tok.eos_token_id
    if self.eos_id is None:
      raise ValueError(f"Tokenizer in {path} has no eos token")
    self.pad_id = (
      self._tok.pad_token_id
      if self._tok.pad_token_id is not None
      else self.eos_id
    )
    self.bos_id = self._tok.bos_token_id
    self.vocab_size = len(self._tok)
    self.path = path
    # The built-in vocabulary saved as files (CharTokenizer.save): the
    # templates treat it as the built-in tokenizer.
    self.char_level = self.vocab_size == CharTokenizer.vocab_size and (
      self.encode(CharTokenizer.ALPHABET)
      == CharTokenizer().encode(CharTokenizer.ALPHABET)
    )

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False)

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode(list(ids), skip_special_tokens=True)

  def chat(self, messages: list[dict]) -> str:
    if not getattr(self._tok, "chat_template", None):
      raise _no_chat_template(self.path)
    return self._tok.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True
    )


def _no_chat_template(path: str) -> ValueError:
  return ValueError(
    f"Tokenizer in {path} has no chat template; use --template=plain, r1 "
    "or boxed"
  )


class SavedCharTokenizer(CharTokenizer):
  """The files `CharTokenizer.save` wrote, read without transformers
  (whose import costs a run seconds): the ids, vocabulary and special
  tokens of `HFTokenizer(path)` on them, and like it no chat template. A
  character outside the alphabet raises CharTokenizer's ValueError, which
  names it, where the HF tokenizer raises "Missing [UNK] token"."""

  def __init__(self, path: str):
    super().__init__()
    self.path = path

  def chat(self, messages: list[dict]) -> str:
    raise _no_chat_template(self.path)


# Files that would give a tokenizer directory more than the three
# CharTokenizer.save writes (a chat template, added or other vocabularies).
_OTHER_TOKENIZER_FILES = (
  "chat_template.jinja",
  "chat_template.json",
  "added_tokens.json",
  "vocab.json",
  "vocab.txt",
  "merges.txt",
  "tokenizer.model",
)


@functools.cache
def _char_files() -> dict[str, object]:
  """file name -> the parsed JSON CharTokenizer.save writes today."""
  with tempfile.TemporaryDirectory() as d:
    CharTokenizer().save(d)
    return {n: _read_json(os.path.join(d, n)) for n in sorted(os.listdir(d))}


def holds_char_tokenizer(path: str) -> bool:
  """Whether `path`'s tokenizer files are exactly CharTokenizer.save's."""
  if any(os.path.exists(os.path.join(path, n)) for n in _OTHER_TOKENIZER_FILES):
    return False
  return all(
    _read_json(os.path.join(path, n)) == want
    for n, want in _char_files().items()
  )


def load(name: str) -> Tokenizer:
  """ "char" for the built-in tokenizer, else a local HF directory (the
  built-in one, without transformers, where its files are
  CharTokenizer.save's)."""
  if name == "char":
    return CharTokenizer()
  if os.path.isdir(name):
    if holds_char_tokenizer(name):
      return SavedCharTokenizer(name)
    return HFTokenizer(name)
  raise ValueError(
    f"Tokenizer {name!r}: expected 'char' or a local "
    "directory with tokenizer files"
  )


# --- Prompt templates ---------------------------------------------------------

# DeepSeek-R1-Zero (arXiv:2501.12948, Table 1), as in oat/understand-r1-zero
# ("r1" template); generation continues after the opening <think>.
R1 = (
  "A conversation between User and Assistant. The User asks a question, "
  "and the Assistant solves it. The Assistant first thinks about the "
  "reasoning process in the mind and then provides the User with the "
  "answer. The reasoning process is enclosed within <think> </think> and "
  "answer is enclosed within <answer> </answer> tags, respectively, i.e., "
  "<think> reasoning process here </think> <answer> answer here </answer>."
  "\nUser: {prompt}\nAssistant: <think>"
)
# Qwen2.5-Math's CoT instruction (its model card), as a system message.
BOXED_SYSTEM = (
  "Please reason step by step, and put your final answer within \\boxed{}."
)

TEMPLATES = ("plain", "r1", "boxed", "chat")


def apply_template(
  tok: Tokenizer, prompt: str, template: str, system: str | None = None
) -> str:
  """Prompt text -> model input text.

  plain  the prompt as is.
  r1     R1-Zero think/answer template (no chat markup; for base models).
  boxed  the tokenizer's chat template with Qwen-Math's boxed-answer system
         message (plain "prompt\\ninstruction" for the char tokenizer).
  chat   the tokenizer's chat template, with `system` if given.
  """
  if template == "plain":
    return prompt
  if template == "r1":
    return R1.format(prompt=prompt)
  if template in ("boxed", "chat"):
    system = BOXED_SYSTEM if template == "boxed" else system
    if getattr(tok, "char_level", False):
      return prompt if system is None else f"{prompt}\n{system}\n"
    messages = [{"role": "system", "content": system}] if system else []
    return tok.chat(messages + [{"role": "user", "content": prompt}])
  raise ValueError(
    f"Unknown template {template!r}; expected one of {TEMPLATES}"
  )


# Printable ASCII (+ newline) is what CharTokenizer covers.
assert set(CharTokenizer.ALPHABET) == set(string.printable) - set(
  "\t\r\x0b\x0c"
)
