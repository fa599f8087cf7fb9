#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Makes the Unigram and WordPiece tokenizer fixtures of tests/data/tokenizers/ with the reference libraries.

  unigram-t5/     a T5-style SentencePiece Unigram model: trained on multilingual.txt by `sentencepiece` with the
                  nmt_nfkc normalization rule (so its precompiled_charsmap is SentencePiece's real NFKC table),
                  converted to tokenizer.json by `tokenizers`' SentencePieceUnigramTokenizer.from_spm (Precompiled +
                  Replace(" {2,}") normalizer, Metaspace pre-tokenizer and decoder, Unigram model with unk_id),
                  with T5's post-processor ($A </s>)
  wordpiece-bert/ a BERT-style WordPiece model trained by `tokenizers` on multilingual.txt with BERT's components
                  (BertNormalizer lowercase + Chinese-character padding + accent stripping, BertPreTokenizer,
                  [CLS] $A [SEP], WordPiece decoder with cleanup)
and their golden_ids.json from `tokenizers` (the same cases as make_goldens.py).

Usage (in a venv with `pip install -r tools/tokenizer/requirements.txt`):
  python tools/tokenizer/make_unigram_wordpiece.py
The fp4serve code under test is never used here.
"""
import json
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.modules.setdefault("sentencepiece_model_pb2", sentencepiece_model_pb2)  # what from_spm imports
from tokenizers.implementations import SentencePieceUnigramTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_goldens import OUT, TEXT, add_decode_only, goldens_for, write_json  # noqa: E402


def unigram_t5():
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "t5")
        spm.SentencePieceTrainer.train(input=str(TEXT), model_prefix=prefix, vocab_size=1500, model_type="unigram",
                                       normalization_rule_name="nmt_nfkc", character_coverage=0.995, pad_id=0,
                                       eos_id=1, unk_id=2, bos_id=-1, byte_fallback=False, minloglevel=2,
                                       num_threads=1, seed_sentencepiece_size=100000)
        spec = json.loads(SentencePieceUnigramTokenizer.from_spm(prefix + ".model")._tokenizer.to_str())
    spec["added_tokens"] = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, c in enumerate(["<pad>", "</s>", "<unk>"])]
    spec["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                         {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                       {"SpecialToken": {"id": "</s>", "type_id": 0}},
                                       {"Sequence": {"id": "B", "type_id": 0}},
                                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                              "special_tokens": {"</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}}
    config = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "tokenizer_class": "T5Tokenizer"}
    return spec, config, ["</s>", "<pad>"]


def wordpiece_bert():
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=2500, special_tokens=specials, show_progress=False,
                                        limit_alphabet=300)
    tok.train_from_iterator(TEXT.read_text(encoding="utf-8").splitlines(keepends=True), trainer=trainer)
    vocab = tok.get_vocab()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    spec = json.loads(tok.to_str())
    config = {"cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]", "pad_token": "[PAD]",
              "mask_token": "[MASK]", "do_lower_case": True, "tokenizer_class": "BertTokenizer"}
    return spec, config, ["[CLS]", "[MASK]", "[SEP]"]


def main():
    for name, make in {"unigram-t5": unigram_t5, "wordpiece-bert": wordpiece_bert}.items():
        spec, config, specials = make()
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))  # the reference parses what we commit
        write_json(folder / "tokenizer.json", spec)
        write_json(folder / "tokenizer_config.json", config)
        golden = goldens_for(tok, specials)
        vocab = tok.get_vocab()
        add_decode_only(tok, golden, [list(reversed(golden["cases"][-1]["ids"][:40])),
                                      [vocab[specials[0]], 5, 6, vocab[specials[-1]], 7]])
        write_json(folder / "golden_ids.json", golden)
        print(f"{name}: vocab {tok.get_vocab_size()}, multilingual text -> {len(golden['cases'][-1]['ids'])} ids")


if __name__ == "__main__":
    main()
