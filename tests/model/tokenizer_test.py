"""Tokenizers: the built-in char tokenizer and a local HF tokenizer."""

import pytest

from rlreason.model import tokenizer


def test_char_tokenizer_round_trip_and_errors():
  tok = tokenizer.load("char")
  text = "3+4*2=3+8\n=11\nanswer: 11"
  ids = tok.encode(text)
  assert len(ids) == len(text) and min(ids) >= 3
  assert max(ids) < tok.vocab_size == 128
  # Special tokens are dropped on decode.
  assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == text
  with pytest.raises(ValueError, match="'\u2603' at offset 2"):
    tok.encode("ab\u2603")


def test_templates_for_char_tokenizer():
  tok = tokenizer.load("char")
  assert tokenizer.apply_template(tok, "1+1=", "plain") == "1+1="
  r1 = tokenizer.apply_template(tok, "1+1=", "r1")
  assert r1.endswith("User: 1+1=\nAssistant: <think>")
  assert "\\boxed{}" in tokenizer.apply_template(tok, "q", "boxed")
  with pytest.raises(ValueError, match="Unknown template 'nope'"):
    tokenizer.apply_template(tok, "q", "nope")


def test_hf_tokenizer_from_local_dir_with_chat_template(tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  transformers = pytest.importorskip("transformers")
  vocab = {"<pad>": 0, "<eos>": 1, "[UNK]": 2}
  for w in "hello world user assistant system : 1 + 2 = 3".split():
    vocab.setdefault(w, len(vocab))
  core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, "[UNK]"))
  core.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  fast = transformers.PreTrainedTokenizerFast(
    tokenizer_object=core, eos_token="<eos>", pad_token="<pad>"
  )
  fast.chat_template = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
  )
  fast.save_pretrained(tmp_path)

  tok = tokenizer.load(str(tmp_path))
  assert (tok.eos_id, tok.pad_id) == (1, 0)
  ids = tok.encode("1 + 2 = 3")
  assert tok.decode(ids + [tok.eos_id]) == "1 + 2 = 3"
  chat = tokenizer.apply_template(tok, "1 + 2", "chat")
  assert chat == "user : 1 + 2 assistant : "
  boxed = tokenizer.apply_template(tok, "1 + 2", "boxed")
  assert boxed.startswith("system : Please reason step by step")


def test_unknown_tokenizer_source():
  with pytest.raises(ValueError, match="expected 'char' or a local"):
    tokenizer.load("/no/such/dir")


def test_train_bpe_learns_numbers_and_round_trips(tmp_path):
  texts = [
    f"{a}*{b}={a * b}\nanswer: {a * b}"
    for a in range(2, 10)
    for b in range(2, 10)
  ] * 3
  tokenizer.train_bpe(texts, str(tmp_path / "a"), 300)
  tokenizer.train_bpe(texts, str(tmp_path / "b"), 300)
  a, b = ((tmp_path / d / "tokenizer.json").read_text() for d in "ab")
  assert a == b  # deterministic in the texts
  tok = tokenizer.load(str(tmp_path / "a"))
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  assert tok.vocab_size <= 300 and not tok.char_level
  # Frequent numbers and words are single tokens; any text still encodes.
  assert len(tok.encode("answer")) == 1
  assert tok.decode(tok.encode("7*8=56")) == "7*8=56"
  assert any(tok.decode([i]) == "56" for i in tok.encode("7*8=56"))
  odd = "Zebra {x} <s> \u00e9t\u00e9\n"
  assert tok.decode(tok.encode(odd)) == odd
  # No chat template: plain works, boxed says so (as for any HF tokenizer).
  assert tokenizer.apply_template(tok, "2+2=", "plain") == "2+2="
  with pytest.raises(ValueError, match="no chat template"):
    tokenizer.apply_template(tok, "2+2=", "boxed")
  with pytest.raises(ValueError, match="259"):
    tokenizer.train_bpe(texts, str(tmp_path / "c"), 100)
