#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders the published chat templates of tests/data/tokenizers/published/ with transformers' own renderer.

For every template × conversation × add_generation_prompt, writes the text transformers'
`render_jinja_template` (the function `apply_chat_template` calls) produces, or the error it raises, to
tests/data/tokenizers/published/golden.json. The variables are those `apply_chat_template` passes: the
tokenizer's special tokens (bos_token, eos_token, ...), `tools`, `documents` and the chat_template_kwargs.
strftime_now reads a fixed clock (2026-01-15 12:00 UTC) so the goldens do not depend on the day.

Usage (in a venv with `pip install -r tools/tokenizer/requirements.txt`):
  python tools/tokenizer/make_template_goldens.py
The fp4serve code under test is never used here.
"""
import datetime as _dt
import json
from pathlib import Path

import jinja2
import transformers
from transformers.utils import chat_template_utils

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "tests" / "data" / "tokenizers" / "published"
FIXED_NOW = _dt.datetime(2026, 1, 15, 12, 0, 0)
FIXED_NOW_UNIX = int(FIXED_NOW.replace(tzinfo=_dt.timezone.utc).timestamp())


class _FixedClock(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


chat_template_utils.datetime = _FixedClock  # transformers' strftime_now calls datetime.now()

LLAMA3 = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
SENTENCEPIECE = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
QWEN = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
GRANITE = {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>", "unk_token": "<|end_of_text|>",
           "pad_token": "<|end_of_text|>"}
GPT_OSS = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
SMOLLM2 = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
           "pad_token": "<|endoftext|>"}

# file → (architecture it stands for, special tokens, extra kwargs conversations)
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("Llama 3.1", LLAMA3, [{"date_string": "01 Feb 2026"}]),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("Llama 3.2", LLAMA3, [{"date_string": "01 Feb 2026"}]),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("Llama 3.3", LLAMA3, [{"tools_in_user_message": False}]),
    "mistralai-Mistral-7B-Instruct-v0.1.jinja": ("Mistral v0.1 / Mixtral 8x7B v0.1", SENTENCEPIECE, []),
    "mistralai-Mistral-7B-Instruct-v0.2.jinja": ("Mistral v0.2 (v1 template)", SENTENCEPIECE, []),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("Mistral tool use (v3-tekken)", SENTENCEPIECE, []),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("Qwen2 / Qwen2.5", QWEN, []),
    "Qwen-Qwen3-0.6B.jinja": ("Qwen3 / Qwen3-MoE", QWEN, [{"enable_thinking": False}, {"enable_thinking": True}]),
    "ibm-granite-granite-3.0-8b-instruct.jinja": ("Granite 3.0 / GraniteMoE", GRANITE, []),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("Granite 3.3", GRANITE, [{"thinking": True}]),
    "ibm-granite-granite-4.0.jinja": ("Granite 4.0", GRANITE, []),
    "openai-gpt-oss-120b.jinja": ("GPT-OSS (harmony)", GPT_OSS,
                                  [{"reasoning_effort": "high", "model_identity": "You are a test model."},
                                   {"builtin_tools": ["browser", "python"]}]),
    "HuggingFaceTB-SmolLM2-135M-Instruct.jinja": ("SmolLM2", SMOLLM2, []),
    # Not published: one use of each construct added for the templates above (macros, call blocks, dictsort, ...).
    "../chat_templates/macros.jinja": ("constructs", SMOLLM2, []),
}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
        "days": {"type": "integer", "description": "Forecast days"}},
        "required": ["location"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Searches the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "tags": {"type": "array", "items": {"type": "string"}}},
                   "required": ["query"]}}}

CONVERSATIONS = {
    "system_multi_turn": {"messages": [
        {"role": "system", "content": "You are a concise assistant. Reply in one sentence."},
        {"role": "user", "content": "Hello! What is 2+2?"},
        {"role": "assistant", "content": "2+2 is 4."},
        {"role": "user", "content": "And in French — « quatre »? 日本語も"}]},
    "multi_turn": {"messages": [
        {"role": "user", "content": "  Name a color.  "},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one, please.\n"}]},
    "single_user": {"messages": [{"role": "user", "content": "Hi"}]},
    "tool_calls": {"tools": [WEATHER_TOOL, SEARCH_TOOL], "messages": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temperature\": 22}"},
        {"role": "assistant", "content": "It is 22 °C in Paris."},
        {"role": "user", "content": "Thanks. And Rome?"}]},
    "tools_only": {"tools": [WEATHER_TOOL], "messages": [
        {"role": "system", "content": "Use tools when they help."},
        {"role": "user", "content": "Weather in Oslo?"}]},
    "reasoning": {"messages": [
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "reasoning_content": "17 has no divisor between 2 and 4.", "content": "Yes."},
        {"role": "user", "content": "Is 21?"}]},
    "content_parts": {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Say hi"}, {"type": "text", "text": "twice"}]}]},
    "documents": {"documents": [{"doc_id": 1, "title": "Oslo", "text": "Oslo is the capital of Norway."}],
                  "messages": [{"role": "user", "content": "What is the capital of Norway?"}]},
}


def render(source, conversation, add_generation_prompt, special, kwargs):
    try:
        rendered, _ = chat_template_utils.render_jinja_template(
            conversations=[conversation["messages"]], tools=conversation.get("tools"),
            documents=conversation.get("documents"), chat_template=source,
            add_generation_prompt=add_generation_prompt, **special, **kwargs)
        return {"text": rendered[0]}
    except (jinja2.TemplateError, TypeError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    smollm2 = json.loads((ROOT / "tests/data/tokenizers/smollm2-real/tokenizer_config.json").read_text())
    (DIR / "HuggingFaceTB-SmolLM2-135M-Instruct.jinja").write_text(smollm2["chat_template"], encoding="utf-8")
    cases = []
    for file, (arch, special, kwarg_sets) in TEMPLATES.items():
        source = (DIR / file).read_text(encoding="utf-8")
        runs = [(name, conv, {}) for name, conv in CONVERSATIONS.items()]
        for k, kwargs in enumerate(kwarg_sets):
            for name in ("system_multi_turn", "tool_calls", "reasoning"):
                runs.append((f"{name}+kwargs{k}", CONVERSATIONS[name], kwargs))
        for name, conv, kwargs in runs:
            for agp in (False, True):
                entry = {"template": file, "architecture": arch, "conversation": name, "add_generation_prompt": agp,
                         "special_tokens": special, "chat_template_kwargs": kwargs, "messages": conv["messages"]}
                for key in ("tools", "documents"):
                    if key in conv:
                        entry[key] = conv[key]
                entry.update(render(source, conv, agp, special, kwargs))
                cases.append(entry)
    golden = {"transformers_version": transformers.__version__, "jinja2_version": jinja2.__version__,
              "now_unix": FIXED_NOW_UNIX, "cases": cases}
    (DIR / "golden.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in c for c in cases)
    print(f"{len(cases)} renders ({errors} errors recorded) -> {DIR / 'golden.json'}")


if __name__ == "__main__":
    main()
