#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders tool-call and reasoning parser goldens from each model family's own published chat template.

No Qwen3 / Llama / Mistral / Granite / GPT-OSS model can run here, so the outputs are not recordings of a model.
They are the next-best thing: the text each family's chat template writes for an assistant turn that carries
`tool_calls` (and `reasoning_content` / `thinking`) -- exactly what the model was trained to emit, since the
template is what formatted its training conversations. For each case:

  prefix = template(messages[:-1], add_generation_prompt=True)   # what the server sends the model
  full   = template(messages,      add_generation_prompt=False)  # the conversation with the assistant turn
  output = full[len(prefix):] without the end-of-turn stop token  # what the model generates

rendered by transformers' own renderer (render_jinja_template, the function apply_chat_template calls) through
tools/tokenizer/make_template_goldens.py, which pins transformers 5.24.0 / jinja2 3.1.6 and the special tokens of
each family, over the verbatim templates in tests/data/tokenizers/published/ (their sources are listed in that
folder's README). The expected content, reasoning and calls are the assistant message's own fields: the parsers
must give back what the template was given. fp4serve code is never used here.

Usage (in the venv of tools/tokenizer/requirements.txt):
  python tools/tool_calls/make_parser_goldens.py   # writes tests/data/tool_calls/rendered.json
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "tokenizer"))
import make_template_goldens as mtg  # noqa: E402  (its renderer, special tokens and tools)

OUT = ROOT / "tests" / "data" / "tool_calls" / "rendered.json"
USER = {"role": "user", "content": "What's the weather in Paris and in 東京?"}
PARIS = {"location": "Paris", "unit": "celsius"}
TOKYO = {"location": "東京", "unit": "celsius", "days": 3}
SEARCH = {"query": "naïve café \"quotes\" \\ back\\slash", "tags": ["a", "b"]}


def call(name, arguments, call_id="call12345"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# name → (template, tool parser, reasoning parser, kwargs, the assistant message, the stop tokens the model ends with)
CASES = [
    ("qwen2.5 one call", "Qwen-Qwen2.5-7B-Instruct.jinja", "hermes", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("get_weather", PARIS)]}, ["<|im_end|>"]),
    ("qwen2.5 text then two calls", "Qwen-Qwen2.5-7B-Instruct.jinja", "hermes", None, {},
     {"role": "assistant", "content": "Let me check both cities.",
      "tool_calls": [call("get_weather", PARIS), call("get_weather", TOKYO)]}, ["<|im_end|>"]),
    ("qwen2.5 escapes in arguments", "Qwen-Qwen2.5-7B-Instruct.jinja", "hermes", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("search", SEARCH)]}, ["<|im_end|>"]),
    ("qwen2.5 plain answer", "Qwen-Qwen2.5-7B-Instruct.jinja", "hermes", None, {},
     {"role": "assistant", "content": "It is sunny in Paris."}, ["<|im_end|>"]),
    ("qwen3 reasoning then a call", "Qwen-Qwen3-0.6B.jinja", "hermes", "qwen3", {},
     {"role": "assistant", "reasoning_content": "The user asks about two cities; call get_weather twice.",
      "content": "", "tool_calls": [call("get_weather", PARIS), call("get_weather", TOKYO)]}, ["<|im_end|>"]),
    ("qwen3 reasoning then an answer", "Qwen-Qwen3-0.6B.jinja", "hermes", "qwen3", {},
     {"role": "assistant", "reasoning_content": "No tool is needed: 2 + 2 = 4.", "content": "The answer is 4."},
     ["<|im_end|>"]),
    ("granite 4.0 one call", "ibm-granite-granite-4.0.jinja", "hermes", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("get_weather", TOKYO)]}, ["<|end_of_text|>"]),
    ("granite 4.0 two calls", "ibm-granite-granite-4.0.jinja", "hermes", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("get_weather", PARIS), call("search", SEARCH)]},
     ["<|end_of_text|>"]),
    ("llama 3.1 one call", "meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("get_weather", PARIS)]}, ["<|eot_id|>", "<|eom_id|>"]),
    ("llama 3.2 one call", "meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3_json", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("search", SEARCH)]}, ["<|eot_id|>", "<|eom_id|>"]),
    ("llama 3.3 one call", "meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3_json", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("get_weather", TOKYO)]}, ["<|eot_id|>", "<|eom_id|>"]),
    ("llama 3.1 plain answer", "meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json", None, {},
     {"role": "assistant", "content": "It is sunny in Paris."}, ["<|eot_id|>"]),
    ("mistral nemo two calls", "mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral", None, {},
     {"role": "assistant", "content": "",
      "tool_calls": [call("get_weather", PARIS, "abcDEF123"), call("get_weather", TOKYO, "xyz789UVW")]}, ["</s>"]),
    ("mistral nemo escapes in arguments", "mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("search", SEARCH, "q1w2e3r4t")]}, ["</s>"]),
    ("gpt-oss one call", "openai-gpt-oss-120b.jinja", "openai", None, {},
     {"role": "assistant", "content": "", "tool_calls": [call("get_weather", PARIS)]}, ["<|call|>"]),
    ("gpt-oss analysis then a call", "openai-gpt-oss-120b.jinja", "openai", "openai_gptoss", {},
     {"role": "assistant", "thinking": "Two cities; start with Paris.",
      "tool_calls": [call("get_weather", PARIS)]}, ["<|call|>"]),
    ("gpt-oss analysis then an answer", "openai-gpt-oss-120b.jinja", "openai", "openai_gptoss", {},
     {"role": "assistant", "thinking": "Nothing to look up.", "content": "It is sunny in Paris."}, ["<|return|>"]),
]


def special_tokens(template):
    return mtg.TEMPLATES[template][1]


def render(template, messages, add_generation_prompt, kwargs):
    source = (mtg.DIR / template).read_text(encoding="utf-8")
    tools = [mtg.WEATHER_TOOL, mtg.SEARCH_TOOL]
    rendered, _ = mtg.chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=source, add_generation_prompt=add_generation_prompt,
        **special_tokens(template), **kwargs)
    return rendered[0]


def main():
    cases = []
    for name, template, tool_parser, reasoning_parser, kwargs, assistant, stops in CASES:
        prefix = render(template, [USER], True, kwargs)
        full = render(template, [USER, assistant], False, kwargs)
        if not full.startswith(prefix):
            raise SystemExit(f"{name}: the full render does not start with the generation prompt")
        output = full[len(prefix):]
        stripped = output.rstrip("\n")
        for stop in stops:  # the model stops at its end-of-turn token, which the server does not return
            if stripped.endswith(stop):
                output = stripped[: -len(stop)]
                break
        else:
            raise SystemExit(f"{name}: the turn does not end with {stops}: {output!r}")
        calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                 for c in assistant.get("tool_calls", [])]
        reasoning = assistant.get("reasoning_content", assistant.get("thinking", ""))
        if reasoning_parser == "qwen3" and reasoning:
            reasoning = "\n" + reasoning.strip("\n") + "\n"  # the template writes <think>\n…\n</think>
        entry = {"name": name, "source": f"tests/data/tokenizers/published/{template}", "tool_parser": tool_parser}
        if reasoning_parser:
            entry["reasoning_parser"] = reasoning_parser
        entry.update({"output": output, "content": assistant.get("content", ""), "reasoning": reasoning,
                      "calls": calls})
        cases.append(entry)
    OUT.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(cases)} rendered outputs -> {OUT}")


if __name__ == "__main__":
    main()
