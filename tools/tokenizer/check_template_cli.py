#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks `fp4serve template` end to end against transformers' renders (tests/data/tokenizers/published/golden.json).

For a few golden cases (published templates chosen with --chat-template FILE, kwargs with --chat-template-kwargs,
tools through the messages file), runs the binary and compares its stdout byte for byte with transformers' text.
Cases whose template reads the clock are skipped (the CLI formats the real date).
Usage: check_template_cli.py FP4SERVE_BINARY TESTS_DATA_DIR       (only the standard library is needed)
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

WANTED = [("Qwen-Qwen3-0.6B.jinja", "tool_calls+kwargs0", True), ("Qwen-Qwen3-0.6B.jinja", "reasoning", False),
          ("meta-llama-Llama-3.1-8B-Instruct.jinja", "tool_calls+kwargs0", True),
          ("ibm-granite-granite-4.0.jinja", "tool_calls", True),
          ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "multi_turn", True),
          ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "tool_calls", False)]


def main():
    binary, data = sys.argv[1], Path(sys.argv[2]) / "tokenizers"
    golden = json.loads((data / "published" / "golden.json").read_text(encoding="utf-8"))
    checked = 0
    for template, conversation, agp in WANTED:
        case = next(c for c in golden["cases"] if c["template"] == template and c["conversation"] == conversation
                    and c["add_generation_prompt"] == agp)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            # A model folder with only the special tokens: the template comes from --chat-template.
            (folder / "tokenizer_config.json").write_text(json.dumps(case["special_tokens"]), encoding="utf-8")
            request = {"messages": case["messages"]}
            for key in ("tools", "documents"):
                if key in case:
                    request[key] = case[key]
            (folder / "messages.json").write_text(json.dumps(request, ensure_ascii=False), encoding="utf-8")
            cmd = [binary, "template", "-m", str(folder), "--messages", str(folder / "messages.json"),
                   "--chat-template", str(data / "published" / template),
                   "--chat-template-kwargs", json.dumps(case["chat_template_kwargs"])]
            if agp:
                cmd.append("--add-generation-prompt")
            out = subprocess.run(cmd, capture_output=True, check=False)
        if out.returncode != 0:
            print(f"FAIL {template} {conversation}: exit {out.returncode}: {out.stderr.decode()}")
            return 1
        if out.stdout.decode("utf-8") != case["text"]:
            print(f"FAIL {template} {conversation}: output differs from transformers\n{out.stdout.decode()!r}\n"
                  f"{case['text']!r}")
            return 1
        if "chat template: --chat-template" not in out.stderr.decode():
            print(f"FAIL {template}: stderr does not say which template was used: {out.stderr.decode()!r}")
            return 1
        checked += 1
    print(f"{checked} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
