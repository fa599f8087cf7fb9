#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Multi-turn chat TTFT against an OpenAI-compatible server (`fp4serve serve`), the prefix-caching target of
issue 40: a long system prompt (about --system-tokens tokens), then --turns user turns, each sending the whole
conversation so far (system, earlier questions and the server's replies) as /v1/chat/completions with
stream=true, greedy, max_tokens --reply-tokens. For each turn it prints the prompt tokens, the cached tokens the
server reports (usage.prompt_tokens_details.cached_tokens) and the time to the first content token, measured
here from the request's start. Run it once against a server with prefix caching and once against one started
with --no-enable-prefix-caching, and compare turns 2..N.

usage: bench_multiturn_chat.py --base-url http://127.0.0.1:8000 [--turns 8] [--system-tokens 1000] [--session N]
       [--reply-tokens 32] [--json]
Standard library only.
"""
import argparse
import json
import statistics
import sys
import time
import urllib.request

QUESTIONS = [
    "Summarise the first rule in one sentence.",
    "Which rule is about numbers?",
    "What does rule twelve ask for?",
    "Is any rule about colours?",
    "Name two rules that talk about time.",
    "What is the last rule?",
    "Which rules would a new reader forget first?",
    "Give me a title for the whole list.",
    "Which rule is the shortest?",
    "Repeat the rule about names.",
]

TOPICS = ["numbers", "colours", "time", "names", "places", "tools", "letters", "weather", "music", "food",
          "rivers", "stars", "books", "doors", "bridges", "gardens"]


def system_prompt(approx_tokens, session):
    """Numbered rules, about 19 tokens each in SmolLM2's tokenizer; deterministic. `session` opens the prompt, so
    that repeated runs against one server share no cached block."""
    lines = [f"Session {session}. You are a helpful assistant. Answer briefly, using the house rules below."]
    i = 1
    while len(" ".join(lines).split()) * 1.55 < approx_tokens:
        topic = TOPICS[i % len(TOPICS)]
        lines.append(f"Rule {i}: when the user asks about {topic}, answer with care and mention rule {i}.")
        i += 1
    return "\n".join(lines)


def stream_chat(base_url, model, messages, max_tokens, timeout):
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(base_url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    text = []
    usage = None
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
    return ttft, "".join(text), usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model id (default: the first /v1/models lists)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--reply-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--session", type=int, default=0, help="opens the system prompt (runs with different values "
                    "share no prefix)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = args.model
    if model is None:
        with urllib.request.urlopen(args.base_url + "/v1/models", timeout=args.timeout) as r:
            model = json.load(r)["data"][0]["id"]
    messages = [{"role": "system", "content": system_prompt(args.system_tokens, args.session)}]
    rows = []
    for turn in range(args.turns):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        ttft, reply, usage = stream_chat(args.base_url, model, messages, args.reply_tokens, args.timeout)
        messages.append({"role": "assistant", "content": reply})
        usage = usage or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        rows.append({"turn": turn + 1, "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached,
                     "ttft_s": ttft, "reply": reply})
    later = [r["ttft_s"] for r in rows[1:] if r["ttft_s"] is not None]
    summary = {"turn1_ttft_s": rows[0]["ttft_s"], "turns2_n_mean_ttft_s": statistics.mean(later) if later else None,
               "turns2_n_median_ttft_s": statistics.median(later) if later else None}
    if args.json:
        json.dump({"turns": rows, **summary}, sys.stdout, indent=1)
        print()
        return
    print("turn | prompt tokens | cached tokens | TTFT ms")
    for r in rows:
        ttft = "-" if r["ttft_s"] is None else f"{r['ttft_s'] * 1e3:.1f}"
        print(f"{r['turn']} | {r['prompt_tokens']} | {r['cached_tokens']} | {ttft}")
    if later:
        print(f"turns 2-{args.turns}: mean TTFT {summary['turns2_n_mean_ttft_s'] * 1e3:.1f} ms, "
              f"median {summary['turns2_n_median_ttft_s'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
