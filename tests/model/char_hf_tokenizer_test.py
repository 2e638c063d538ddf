"""The char tokenizer saved as HF tokenizer files reproduces CharTokenizer."""

import json
import os

import pytest

from rlreason.model import tokenizer

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

CHAR = tokenizer.CharTokenizer()
# Every character of the alphabet, plus repeated / leading / trailing spaces
# and newlines, and text that spells the special and unused tokens.
TEXT = (
  "  "
  + CHAR.ALPHABET
  + CHAR.ALPHABET[::-1]
  + "\n\n  a  b   c\n <s></s><pad><unused0> x+1=2, y! \n  "
)
UNUSED = list(range(3 + len(CHAR.ALPHABET), 128))  # 99..127


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("char_tok"))
  CHAR.save(path)
  return path


def test_saved_files(saved_dir):
  names = sorted(os.listdir(saved_dir))
  assert names == [
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
  ]
  assert all(
    os.path.getsize(os.path.join(saved_dir, n)) < 20_000 for n in names
  )


def test_auto_tokenizer_matches_char_tokenizer(saved_dir):
  hf = transformers.AutoTokenizer.from_pretrained(
    saved_dir, local_files_only=True
  )
  assert len(hf) == 128
  assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2)
  assert UNUSED[0] == 99
  assert hf.convert_ids_to_tokens([3, 4, 98, 99]) == [
    "\n",
    " ",
    "~",
    "<unused0>",
  ]

  ids = CHAR.encode(TEXT)
  assert hf.encode(TEXT, add_special_tokens=False) == ids
  # Nothing is added with add_special_tokens=True either (no post-processor).
  assert hf.encode(TEXT) == ids
  # "<s>" in text is three characters, not the bos token.
  assert hf.encode("<s>", add_special_tokens=False) == CHAR.encode("<s>")

  padded = [1] + ids + UNUSED + [2, 0, 0]
  assert hf.decode(padded, skip_special_tokens=True) == TEXT
  assert CHAR.decode(padded) == TEXT
  assert hf.decode([1] + CHAR.encode(" a ") + [2]) == "<s> a </s>"


# The files read by transformers, and by load() without it: both are
# CharTokenizer.
READERS = [tokenizer.HFTokenizer, tokenizer.load]


@pytest.mark.parametrize("read", READERS)
def test_saved_files_read_back_as_char_tokenizer(saved_dir, read):
  tok = read(saved_dir)
  assert tok.vocab_size == CHAR.vocab_size == 128
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  ids = tok.encode(TEXT)
  assert ids == CHAR.encode(TEXT)
  padded = [tok.bos_id] + ids + UNUSED + [tok.eos_id, tok.pad_id]
  assert tok.decode(padded) == CHAR.decode(padded) == TEXT
  for c in CHAR.ALPHABET:
    assert tok.encode(c) == CHAR.encode(c)
    assert tok.decode(tok.encode(c)) == c


@pytest.mark.parametrize("read", READERS)
def test_templates_without_chat_template_match_char_tokenizer(saved_dir, read):
  tok = read(saved_dir)
  assert tok.char_level and CHAR.char_level
  for template in tokenizer.TEMPLATES:
    got = tokenizer.apply_template(tok, "1+1=", template)
    assert got == tokenizer.apply_template(CHAR, "1+1=", template)
  assert tokenizer.apply_template(tok, "q", "chat", system="s") == "q\ns\n"
  with pytest.raises(ValueError, match="has no chat template"):
    tok.chat([{"role": "user", "content": "q"}])


def test_load_reads_the_char_files_without_transformers(saved_dir):
  tok = tokenizer.load(saved_dir)
  assert isinstance(tok, tokenizer.SavedCharTokenizer)
  assert tok.path == saved_dir
  # The laptop base ships them too: a run on it imports no transformers.
  from rlreason.model import presets

  base = presets.checkpoint_dir("laptop-base")
  assert isinstance(tokenizer.load(base), tokenizer.SavedCharTokenizer)


@pytest.mark.parametrize(
  "change",
  [
    # A chat template, in the config or in its own file.
    lambda d: _edit(d, "tokenizer_config.json", chat_template="{{ x }}"),
    lambda d: open(os.path.join(d, "chat_template.jinja"), "w").write("x"),
    # Another eos token, another vocabulary.
    lambda d: _edit(d, "special_tokens_map.json", eos_token="<pad>"),
    lambda d: _edit(d, "tokenizer.json", model_vocab=("a", 99)),
  ],
)
def test_any_other_tokenizer_files_load_through_transformers(tmp_path, change):
  CHAR.save(str(tmp_path))
  change(str(tmp_path))
  assert isinstance(tokenizer.load(str(tmp_path)), tokenizer.HFTokenizer)


def _edit(path, name, model_vocab=None, **fields):
  with open(os.path.join(path, name)) as f:
    obj = json.load(f)
  obj.update(fields)
  if model_vocab:
    token, i = model_vocab
    obj["model"]["vocab"] = {
      t: j for t, j in obj["model"]["vocab"].items() if j != i
    }
    obj["model"]["vocab"][token + "x"] = i
  with open(os.path.join(path, name), "w") as f:
    json.dump(obj, f)


@pytest.mark.parametrize("bad", ["caf\u00e9", "a\tb", "\r\n"])
def test_out_of_alphabet_character_raises(saved_dir, bad):
  # The vocabulary has no unk token, so the HF tokenizer raises (the
  # `tokenizers` WordLevel error) instead of mapping to some id, as
  # CharTokenizer (and load(), which reads the files as one) raises
  # ValueError.
  hf = transformers.AutoTokenizer.from_pretrained(
    saved_dir, local_files_only=True
  )
  with pytest.raises(Exception, match=r"Missing \[UNK\] token"):
    hf.encode(bad, add_special_tokens=False)
  with pytest.raises(Exception, match=r"Missing \[UNK\] token"):
    tokenizer.HFTokenizer(saved_dir).encode(bad)
  for tok in (CHAR, tokenizer.load(saved_dir)):
    with pytest.raises(ValueError, match="not in the built-in char"):
      tok.encode(bad)


@pytest.mark.parametrize("read", READERS)
def test_a_model_directory_keeps_the_char_tokenizer(tmp_path, read):
  # Beside a Qwen2 config.json, AutoTokenizer would pick Qwen2Tokenizer
  # (its own pre-tokenizer, a 129th id); HFTokenizer keeps the saved fast
  # one.
  from rlreason.model import hf
  from rlreason.model import presets

  CHAR.save(str(tmp_path))
  with open(tmp_path / "config.json", "w") as f:
    json.dump(hf.config_to_hf(presets.get("small")), f)
  tok = read(str(tmp_path))
  assert tok.vocab_size == 128 and tok.char_level
  assert tok.encode(TEXT) == CHAR.encode(TEXT)
