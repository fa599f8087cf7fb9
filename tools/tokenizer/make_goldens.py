#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Make the tokenizer and chat-template fixtures of tests/text from the reference libraries.

Writes, under tests/data/tokenizers/:
  <family>/tokenizer.json, tokenizer_config.json  -- small BPE tokenizers trained here with the HF `tokenizers`
                                                    library, each configured exactly like one model family
                                                    (see README.md in this folder for what mirrors what)
  <family>/golden_ids.json                         -- ids, decodes and streaming-decode steps from `tokenizers`
  smollm2-real/                                    -- the real SmolLM2-135M-Instruct tokenizer (if available)
  chat_templates/<name>.jinja, chat_golden.json    -- templates and their renders by jinja2, in the environment
                                                    transformers uses (ImmutableSandboxedEnvironment with
                                                    trim_blocks, lstrip_blocks, raise_exception and tojson)

Usage (in a venv with `pip install tokenizers jinja2`):
  python tools/tokenizer/make_goldens.py [--smollm2 models/default-src]
The fp4serve code under test is never used here.
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, trainers

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "tokenizers"
TEXT = OUT / "multilingual.txt"

# The split regexes, verbatim from the published tokenizer.json files of each family.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

SP = "\u2581"  # SentencePiece's meta space


def byte_level(add_prefix_space=False, trim_offsets=True, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets,
            "use_regex": use_regex}


def split_regex(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def added(id_, content, special=True, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def template_bos(bos, bos_id):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def train_bpe(pre_tokenizer, normalizer, vocab_size, limit_alphabet=None, byte_level_alphabet=True):
    """Trains a BPE model on the multilingual text with the given front end; returns (vocab, merges)."""
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": {}, "merges": []}}
    tok = Tokenizer.from_str(json.dumps(spec))
    kwargs = {"vocab_size": vocab_size, "show_progress": False, "special_tokens": []}
    if byte_level_alphabet:
        kwargs["initial_alphabet"] = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    if limit_alphabet is not None:
        kwargs["limit_alphabet"] = limit_alphabet
    lines = TEXT.read_text(encoding="utf-8").splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainers.BpeTrainer(**kwargs))
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], model["merges"]


def bpe_model(vocab, merges, **overrides):
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": merges}
    model.update(overrides)
    return model


def assemble(model, added_tokens, normalizer, pre_tokenizer, post_processor, decoder):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": decoder, "model": model}


def append_specials(vocab, names, **flags):
    """Appends special tokens after the trained vocabulary (as Llama-3 and Qwen2 number theirs)."""
    result = []
    for name in names:
        vocab[name] = len(vocab)
        result.append(added(vocab[name], name, **flags))
    return result


# ---------------------------------------------------------------------------------------------- families


def family_gpt2():
    vocab, merges = train_bpe(byte_level(), None, 3000)
    specials = append_specials(vocab, ["<|endoftext|>"])
    # Extra added tokens exercise lstrip (RoBERTa's <mask> style), rstrip and single_word matching.
    extra = [added(len(vocab), "<|mask|>", special=True, lstrip=True),
             added(len(vocab) + 1, "[TOOL]", special=False, normalized=False, single_word=True, rstrip=True)]
    spec = assemble(bpe_model(vocab, merges), specials + extra, None, byte_level(),
                    byte_level(trim_offsets=True), byte_level())
    config = {"add_prefix_space": False, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
              "unk_token": "<|endoftext|>", "tokenizer_class": "GPT2Tokenizer"}
    return spec, config, ["<|endoftext|>", "<|mask|>", "[TOOL]"]


def family_llama3():
    pre = {"type": "Sequence", "pretokenizers": [split_regex(LLAMA3_PATTERN), byte_level(use_regex=False)]}
    vocab, merges = train_bpe(pre, None, 3000)
    # Whole words in the vocabulary that no merge chain builds: only ignore_merges=true finds them.
    for word in ["\u0120tokenizers", "\u0120quantization", "\u0120multilingual"]:
        vocab.setdefault(word, len(vocab))
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    specials = append_specials(vocab, names)
    post = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        template_bos("<|begin_of_text|>", vocab["<|begin_of_text|>"])]}
    spec = assemble(bpe_model(vocab, merges, ignore_merges=True), specials, None, pre, post, byte_level())
    config = {"add_bos_token": True, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
              "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATES["llama3"]}
    return spec, config, ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>"]


def family_qwen2():
    pre = {"type": "Sequence", "pretokenizers": [split_regex(QWEN2_PATTERN), byte_level(use_regex=False)]}
    vocab, merges = train_bpe(pre, {"type": "NFC"}, 3000)
    specials = append_specials(vocab, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    # Qwen2.5 declares <tool_call> as a non-special added token; "café" is normalized (NFC) before matching,
    # so its decomposed spelling in the text matches too.
    extra = append_specials(vocab, ["<tool_call>", "</tool_call>"], special=False, normalized=False)
    extra += append_specials(vocab, ["caf\u00e9"], special=False, normalized=True)
    post = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spec = assemble(bpe_model(vocab, merges), specials + extra, {"type": "NFC"}, pre, post,
                    byte_level(add_prefix_space=False, trim_offsets=False, use_regex=False))
    config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer",
              "chat_template": TEMPLATES["chatml"]}
    return spec, config, ["<|im_start|>", "<|im_end|>", "<tool_call>"]


def family_smollm2():
    pre = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level()]}
    vocab, merges = train_bpe(pre, None, 3000)
    # SmolLM2 numbers its specials first: shift the trained vocabulary up.
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {**{n: i for i, n in enumerate(names)}, **{k: v + len(names) for k, v in vocab.items()}}
    specials = [added(i, n) for i, n in enumerate(names)]
    post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    spec = assemble(bpe_model(vocab, merges), specials, None, pre, post, byte_level(add_prefix_space=True))
    config = {"add_bos_token": False, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "unk_token": "<|endoftext|>", "tokenizer_class": "GPT2Tokenizer",
              "chat_template": TEMPLATES["smollm2"]}
    return spec, config, names


def sentencepiece_vocab():
    """A SentencePiece-style BPE vocabulary: <unk> <s> </s>, the 256 <0xXX> byte tokens, then the trained
    pieces (trained with Metaspace word splitting and a limited alphabet so rare characters need byte fallback)."""
    pre = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "always", "split": True}
    trained, merges = train_bpe(pre, None, 3000, limit_alphabet=160, byte_level_alphabet=False)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    return vocab, merges


SP_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
SP_SPECIALS = [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")]


def family_llama2():
    vocab, merges = sentencepiece_vocab()
    normalizer = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": SP}, {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
    model = bpe_model(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    spec = assemble(model, SP_SPECIALS, normalizer, None, template_bos("<s>", 1), SP_DECODER)
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "legacy": True, "tokenizer_class": "LlamaTokenizer"}
    return spec, config, ["<s>", "</s>", "<unk>"]


def family_mistral():
    vocab, merges = sentencepiece_vocab()
    for name in ["[INST]", "[/INST]"]:
        vocab[name] = len(vocab)
    pre = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": False}
    model = bpe_model(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    specials = SP_SPECIALS + [added(vocab["[INST]"], "[INST]"), added(vocab["[/INST]"], "[/INST]")]
    spec = assemble(model, specials, None, pre, template_bos("<s>", 1), SP_DECODER)
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "legacy": False, "tokenizer_class": "LlamaTokenizer",
              "chat_template": TEMPLATES["mistral"]}
    return spec, config, ["<s>", "[INST]", "[/INST]"]


def family_metaspace():
    vocab, merges = sentencepiece_vocab()
    pre = {"type": "Metaspace", "replacement": SP, "add_prefix_space": True}  # pre-2024 serialization
    decoder = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": SP, "add_prefix_space": True}]}
    model = bpe_model(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    spec = assemble(model, SP_SPECIALS, None, pre, template_bos("<s>", 1), decoder)
    config = {"bos_token": {"content": "<s>", "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "__type": "AddedToken"},
              "eos_token": {"content": "</s>", "__type": "AddedToken"}, "unk_token": "<unk>",
              "tokenizer_class": "LlamaTokenizer", "chat_template": TEMPLATES["granite"]}
    return spec, config, ["<s>", "</s>"]


def family_options(fuse_unk):
    """Not a published family: the remaining BPE options and pipeline components in one tokenizer (unk_token
    with or without fuse_unk, continuing_subword_prefix, end_of_word_suffix, every Split behavior, Whitespace,
    Digits, NFKC/Replace/Strip/Lowercase normalizers, BPEDecoder, RobertaProcessing)."""
    normalizer = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
        {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "Lowercase"}]}
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[,.;:!?]+"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Whitespace"},
        {"type": "Digits", "individual_digits": False},
        {"type": "Split", "pattern": {"Regex": "[aeiou]"}, "behavior": "Contiguous", "invert": True},
        {"type": "Split", "pattern": {"String": "_"}, "behavior": "Removed", "invert": False}]}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": normalizer,
            "pre_tokenizer": pre, "post_processor": None, "decoder": None,
            "model": bpe_model({}, [], continuing_subword_prefix="##", end_of_word_suffix="</w>")}
    tok = Tokenizer.from_str(json.dumps(spec))
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False, limit_alphabet=100,
                                  special_tokens=["[UNK]", "<s>", "</s>"], continuing_subword_prefix="##",
                                  end_of_word_suffix="</w>")
    tok.train_from_iterator(TEXT.read_text(encoding="utf-8").splitlines(keepends=True), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    model.update(unk_token="[UNK]", fuse_unk=fuse_unk)
    vocab = model["vocab"]
    specials = [added(vocab[n], n) for n in ["[UNK]", "<s>", "</s>"]]
    post = {"type": "RobertaProcessing", "sep": ["</s>", vocab["</s>"]], "cls": ["<s>", vocab["<s>"]],
            "trim_offsets": True, "add_prefix_space": False}
    spec = assemble(model, specials, normalizer, pre, post, {"type": "BPEDecoder", "suffix": "</w>"})
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "[UNK]"}
    return spec, config, ["<s>", "</s>", "[UNK]"]


FAMILIES = {"gpt2": family_gpt2, "llama3": family_llama3, "qwen2": family_qwen2, "smollm2": family_smollm2,
            "llama2": family_llama2, "mistral": family_mistral, "metaspace": family_metaspace,
            "options-fused-unk": lambda: family_options(True), "options-unk": lambda: family_options(False)}

# ---------------------------------------------------------------------------------------------- goldens


def edge_strings(specials):
    a, b = specials[0], specials[-1]
    return {
        "empty": "",
        "one_space": " ",
        "spaces": "   ",
        "newline": "\n",
        "newlines": "\n\n\n",
        "leading_spaces": "  leading",
        "trailing_spaces": "trailing   ",
        "digits": "12345678",
        "emoji_zwj": "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 \U0001F44D\U0001F3FD "
                     "\U0001F3F3\uFE0F\u200D\U0001F308!",
        "cjk": "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff1a\u4f60\u597d\uff0c\u4e16\u754c\uff01\u9f98\u9f49",
        "arabic": "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0661\u0662\u0663",
        "code_tabs": "def f(x):\n\tif x:\n\t\treturn x * 2  # double\n\treturn 0\n",
        "contractions": "I'm sure YOU'RE right, they'LL see it's 'quoted'",
        "crlf": "line one\r\nline two\r\n\r\n",
        "decomposed": "e\u0301cole cafe\u0301 A\u030a",
        "unicode_spaces": "a\u00a0b\u3000c\u2009d\u0085e",
        "specials_inside": f"Hello{a}world {b} x{a}{a}  {b}  tail",
        "special_only": a,
        "mixed": "Tokyo\u6771\u4eac 2024\u5e74 \u20b91,00,000 \U0001F600 na\u00efve",
    }


def stream_steps(tok, ids, skip):
    stream = tokenizers.decoders.DecodeStream(skip_special_tokens=skip)
    return [stream.step(tok, i) for i in ids]


def goldens_for(tok, specials, extra_cases=None):
    cases = edge_strings(specials)
    cases["added_tokens_spacing"] = f"x   {specials[1]}  y{specials[-1]}z {specials[-1]} ({specials[0]})"
    cases.update(extra_cases or {})
    cases["multilingual"] = TEXT.read_text(encoding="utf-8")
    result = {"tokenizers_version": tokenizers.__version__, "cases": []}
    for name, text in cases.items():
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        entry = {"name": name, "text": text, "ids": ids, "ids_no_special": plain,
                 "decoded": tok.decode(ids, skip_special_tokens=False),
                 "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)}
        if name != "multilingual":
            entry["stream_skip_special"] = stream_steps(tok, ids, True)
        result["cases"].append(entry)
    # Decoding arbitrary id sequences (not from encode) exercises broken UTF-8 and lone byte tokens.
    result["decode_only"] = []
    return result


def add_decode_only(tok, golden, id_lists):
    for ids in id_lists:
        golden["decode_only"].append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
                                      "stream": stream_steps(tok, ids, False)})


def broken_utf8_ids(tok):
    """Id lists that split multi-byte characters or are invalid UTF-8 on their own."""
    vocab = tok.get_vocab()
    lists = []
    byte_tokens = [f"<0x{b:02X}>" for b in (0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0x41, 0xFF)]
    if all(t in vocab for t in byte_tokens):
        ids = [vocab[t] for t in byte_tokens]
        lists += [ids, ids[:2], ids[3:6] + ids[7:8], [ids[8], ids[7]], ids[4:]]
    elif bytes_to_unicode()[0x41] not in vocab:
        # Neither byte fallback nor a byte alphabet: an arbitrary id sequence, with the unknown token.
        ids = tok.encode("Na\u00efve caf\u00e9 \u4e2d\u6587 ok").ids
        lists.append(list(reversed(ids)))
    else:
        # ByteLevel: single-byte symbols of the GPT-2 byte map.
        table = bytes_to_unicode()
        invalid = next(b for b in (0xFF, 0xFE, 0xC0, 0xC1, 0xF8, 0x80) if table[b] in vocab)  # invalid alone
        syms = [table[b] for b in (0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0x41, invalid)]
        ids = [vocab[s] for s in syms]
        lists += [ids, ids[:2], ids[3:6] + ids[7:8], [ids[8], ids[7]], ids[4:]]
    return lists


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_json(path, obj):
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------- chat templates

# Reconstructions of the published templates' structure (see README.md); SmolLM2's is the real one, read from
# the default model's tokenizer_config.json when available.
TEMPLATES = {
    "smollm2": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
        "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "chatml": (
        "{%- for message in messages %}\n"
        "    {%- if loop.first and message.role != 'system' %}\n"
        "        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "    {{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n"),
    "llama3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}"
        "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
        "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
        "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    "mistral": (
        "{%- if messages[0]['role'] == 'system' %}\n"
        "    {%- set system_message = messages[0]['content'] %}\n"
        "    {%- set loop_messages = messages[1:] %}\n"
        "{%- else %}\n"
        "    {%- set loop_messages = messages %}\n"
        "{%- endif %}\n"
        "\n"
        "{{- bos_token }}\n"
        "{%- for message in loop_messages %}\n"
        "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
        "        {{- raise_exception('After the optional system message, conversation roles must alternate "
        "user/assistant/user/assistant/...') }}\n"
        "    {%- endif %}\n"
        "    {%- if message['role'] == 'user' %}\n"
        "        {%- if loop.last and system_message is defined %}\n"
        "            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}\n"
        "        {%- else %}\n"
        "            {{- '[INST] ' + message['content'] + '[/INST]' }}\n"
        "        {%- endif %}\n"
        "    {%- elif message['role'] == 'assistant' %}\n"
        "        {{- ' ' + message['content'] + eos_token}}\n"
        "    {%- else %}\n"
        "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an "
        "initial optional system message!') }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"),
    "granite": (
        "{%- if messages[0]['role'] == 'system' %}\n"
        "    {%- set system_message = messages[0]['content'] %}\n"
        "    {%- set loop_messages = messages[1:] %}\n"
        "{%- else %}\n"
        "    {%- set system_message = \"Knowledge Cutoff Date: April 2024.\\nYou are Granite, developed by IBM.\" %}\n"
        "    {%- if tools and documents %}\n"
        "        {%- set system_message = system_message + \" You are a helpful AI assistant with access to the "
        "following tools. When a tool is required to answer the user's query, respond with <|tool_call|> followed "
        "by a JSON list of tools used. If a tool does not exist in the provided list of tools, notify the user "
        "that you do not have the ability to fulfill the request.\\n\\nWrite the response to the user's input by "
        "strictly aligning with the facts in the provided documents.\" %}\n"
        "    {%- elif tools %}\n"
        "        {%- set system_message = system_message + \" You are a helpful AI assistant with access to the "
        "following tools. When a tool is required to answer the user's query, respond with <|tool_call|> followed "
        "by a JSON list of tools used.\" %}\n"
        "    {%- else %}\n"
        "        {%- set system_message = system_message + \" You are a helpful AI assistant.\" %}\n"
        "    {%- endif %}\n"
        "    {%- set loop_messages = messages %}\n"
        "{%- endif %}\n"
        "{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\\n' }}\n"
        "{%- if tools %}\n"
        "    {{- '<|start_of_role|>tools<|end_of_role|>' }}\n"
        "    {{- tools | tojson(indent=4) }}\n"
        "    {{- '<|end_of_text|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- for message in loop_messages %}\n"
        "    {{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}\n"
        "    {%- if loop.last and add_generation_prompt %}\n"
        "        {{- '<|start_of_role|>assistant<|end_of_role|>' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"),
    # Not a published template: every construct of the supported subset in one place, written with the
    # default whitespace (no '-'), so trim_blocks / lstrip_blocks decide the output.
    "features": (
        "{# every supported construct #}\n"
        "{% set ns = namespace(count=0, last_role='', seen=[]) %}\n"
        "{% for message in messages %}\n"
        "    {% set ns.count = ns.count + 1 %}\n"
        "    {% if message.role == 'system' %}\n"
        "[SYS {{ loop.index }}/{{ loop.length }}] {{ message.content | trim | upper }}\n"
        "    {% elif message['role'] in ['user', 'human'] and not loop.last %}\n"
        "[U{{ loop.index0 }}{{ '*' if loop.first else '' }}] {{ message.content.strip() }}|{{ message.content | length }}\n"
        "    {% elif message.content.startswith('#') or message.content.endswith('!') %}\n"
        "[HASH] {{ message.content.split()|join(',') }} {{ message.content.split('a') | length }}\n"
        "    {% else %}\n"
        "[{{ message.role | lower }}] {{ message.content }} {{ (loop.revindex ~ '-' ~ loop.revindex0) }}\n"
        "    {% endif %}\n"
        "    {%- set ns.last_role = message.role -%}\n"
        "{% endfor %}\n"
        "count={{ ns.count }} last={{ ns.last_role }} {{ messages | length > 2 }} {{ 7 // 2 }} {{ 7 % 3 }} "
        "{{ 2 * 3 - 1 }} {{ -3 + 10 }} {{ 1.5 * 2 }} {{ 7 / 2 }}\n"
        "{% if undefined_var is not defined and bos_token is defined and bos_token is string %}defined-ok{% endif %}\n"
        "{% if none_value is none %}none-ok{% endif %} {{ none_value }} {{ true }} {{ [1, 'a', none] }}\n"
        "{{ messages[0].role }} {{ messages[-1]['role'] }} {{ messages[1:] | length }} {{ 'abcdef'[1:4] }} "
        "{{ 'x' ~ 3 ~ none }} {{ 'A,b,C'.lower().split(',') }}\n"
        "{{ tools | tojson }} {{ {'k': 'v\u00e9', 'n': [1, 2.5, true, none]} | tojson }}\n"
        "{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %} {{ 'yes' if add_generation_prompt else 'no' }}\n"
        "  {%+ if true %}keep-lstrip{% endif +%}\n"
        "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}{{ m.role[0] }}{% endfor %}\n"
        "{{ 'a' == 'a' and 1 < 2 <= 2 and not (3 >= 4) and 'z' not in 'abc' }}\n"
        "{% if add_generation_prompt %}<gen>{% endif %}\n"),
}


def transformers_env():
    """The environment transformers.utils.chat_template_utils builds for apply_chat_template."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def conversations():
    sys_msg = {"role": "system", "content": "  You are terse.\nAnswer in one line.  "}
    u1 = {"role": "user", "content": "What is 12+30?"}
    a1 = {"role": "assistant", "content": " 42. \n"}
    u2 = {"role": "user", "content": "Et en fran\u00e7ais ? \u4f60\u597d \U0001F600"}
    u_hash = {"role": "user", "content": "#tag and a banana!"}
    return {
        "user": [u1],
        "system_user": [sys_msg, u1],
        "multi_turn": [u1, a1, u2],
        "system_multi_turn": [sys_msg, u1, a1, u2],
        "hash_last": [sys_msg, u1, a1, u_hash],
        "bad_alternation": [u1, u2],
    }


# Keys in sorted order: the C++ side receives extra_context as nlohmann::json, whose objects are sorted.
TOOLS = [{"function": {"description": "Get the weather \u00e0 Paris", "name": "get_weather",
                                           "parameters": {"properties": {"city": {"type": "string"}},
                                                          "required": ["city"], "type": "object"}},
          "type": "function"}]


def make_chat_goldens(smollm2_template):
    env = transformers_env()
    templates = dict(TEMPLATES)
    if smollm2_template is not None:
        templates["smollm2"] = smollm2_template
    tdir = OUT / "chat_templates"
    tdir.mkdir(exist_ok=True)
    golden = {"jinja2_version": jinja2.__version__, "templates": {}}
    for name, source in templates.items():
        (tdir / f"{name}.jinja").write_text(source, encoding="utf-8")
        compiled = env.from_string(source)
        cases = []
        for conv_name, messages in conversations().items():
            for gen in (False, True):
                extra = {"bos_token": "<s>", "eos_token": "</s>"}
                if name in ("granite", "features"):
                    extra["tools"] = TOOLS if conv_name == "system_user" or name == "features" else None
                case = {"conversation": conv_name, "messages": messages, "add_generation_prompt": gen,
                        "extra_context": extra}
                try:
                    case["expected"] = compiled.render(messages=messages, add_generation_prompt=gen, **extra)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
        golden["templates"][name] = {"file": f"chat_templates/{name}.jinja", "cases": cases}
    write_json(OUT / "chat_golden.json", golden)


# ---------------------------------------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smollm2", type=Path, default=ROOT / "models" / "default-src",
                        help="folder with the real SmolLM2 tokenizer.json / tokenizer_config.json")
    args = parser.parse_args()

    smollm2_template = None
    real = args.smollm2
    if (real / "tokenizer.json").exists():
        smollm2_template = json.loads((real / "tokenizer_config.json").read_text())["chat_template"]
        TEMPLATES["smollm2"] = smollm2_template
    else:
        print(f"note: {real}/tokenizer.json not found; smollm2-real fixture left as is", file=sys.stderr)

    for name, make in FAMILIES.items():
        spec, config, specials = make()
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(spec, ensure_ascii=False)
        tok = Tokenizer.from_str(text)  # the reference parses exactly what we commit
        write_json(folder / "tokenizer.json", spec)
        write_json(folder / "tokenizer_config.json", config)
        golden = goldens_for(tok, specials)
        add_decode_only(tok, golden, broken_utf8_ids(tok))
        write_json(folder / "golden_ids.json", golden)
        n = len(golden["cases"][-1]["ids"])
        print(f"{name}: vocab {tok.get_vocab_size()}, multilingual text -> {n} ids")

    if smollm2_template is not None:
        folder = OUT / "smollm2-real"
        folder.mkdir(exist_ok=True)
        shutil.copyfile(real / "tokenizer.json", folder / "tokenizer.json")
        shutil.copyfile(real / "tokenizer_config.json", folder / "tokenizer_config.json")
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        golden = goldens_for(tok, ["<|im_start|>", "<|im_end|>"])
        add_decode_only(tok, golden, broken_utf8_ids(tok))
        write_json(folder / "golden_ids.json", golden)
        print(f"smollm2-real: vocab {tok.get_vocab_size()}, multilingual -> {len(golden['cases'][-1]['ids'])} ids")

    make_chat_goldens(smollm2_template)
    # tokenizer.json and golden_ids.json are tracked xz-compressed (8x smaller); the build inflates them
    sys.path.insert(0, str(ROOT / "tools"))
    import test_data_xz
    for folder in sorted(p for p in OUT.iterdir() if (p / "golden_ids.json").exists()):
        for name in ("tokenizer.json", "golden_ids.json"):
            test_data_xz.compress(test_data_xz.inflate(str(folder / name)))  # smollm2-real may be kept as is
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
