"""Tiny shared ByteLevel-BPE tokenizer for the reference fixtures.

Trained with the `tokenizers` library on the plain-text license files that Debian
ships under /usr/share/common-licenses (regular files only, sorted by name).
"""
import hashlib
import json
import os

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML template (written for this project).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEXT_DIR = "/usr/share/common-licenses"


def training_files():
    names = sorted(os.listdir(TEXT_DIR))
    out = []
    for n in names:
        p = os.path.join(TEXT_DIR, n)
        if os.path.isfile(p) and not os.path.islink(p):
            out.append(p)
    return out


def build(out_dir, vocab_size):
    """Train the tokenizer, write tokenizer.json + tokenizer_config.json to out_dir.

    Returns a dict for MANIFEST.json.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    files = training_files()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tok.token_to_id(s)): {
                "content": s, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False, "special": True,
            }
            for s in SPECIALS
        },
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    return {
        "kind": "ByteLevel BPE (tokenizers.models.BPE + ByteLevel pre-tokenizer/decoder)",
        "vocab_size": vocab_size,
        "special_tokens": {s: tok.token_to_id(s) for s in SPECIALS},
        "chat_template": "ChatML (<|im_start|>role\\ncontent<|im_end|>\\n)",
        "training_text": [
            {"path": p, "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest()}
            for p in files
        ],
        "trainer": {"min_frequency": 2, "initial_alphabet": "ByteLevel.alphabet()"},
    }


def special_ids(tok_dir):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    return {s: tok.token_to_id(s) for s in SPECIALS}
