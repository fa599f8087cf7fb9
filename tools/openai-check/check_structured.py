#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Structured outputs, forced tool calls and n > 1 of a running fp4serve server, through the official `openai`
client; every constrained reply is validated with `jsonschema` (scripts/check-structured-outputs.sh starts the
server on the default model and runs this).

    check_structured.py BASE_URL MODEL

Exits 1 naming every failed check. Bounded: each request has a 120 s timeout and at most a few hundred tokens.
"""
import json
import re
import sys

import jsonschema
import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", timeout=120, max_retries=0)
failures = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if not ok and detail else ""), flush=True)
    if not ok:
        failures.append(name)


def chat(prompt, max_tokens=256, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                          max_tokens=max_tokens, temperature=0, **kw)


# 20 schemas: nested objects, enums, arrays, required fields, numbers with bounds.
S = {"type": "string", "maxLength": 24}
SCHEMAS = [
    ("person", {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"]}),
    ("city", {"type": "object", "properties": {"city": S, "country": S,
                                               "population": {"type": "integer", "minimum": 0, "maximum": 40000000}},
              "required": ["city", "country", "population"]}),
    ("color enum", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]}),
    ("boolean flags", {"type": "object", "properties": {"done": {"type": "boolean"}, "urgent": {"type": "boolean"}},
                       "required": ["done", "urgent"]}),
    ("bounded number", {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 60}},
                        "required": ["temperature"]}),
    ("array of strings", {"type": "object", "properties": {"fruits": {"type": "array", "items": S, "minItems": 2,
                                                                      "maxItems": 4}}, "required": ["fruits"]}),
    ("array of integers", {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 3,
                           "maxItems": 3}),
    ("nested address", {"type": "object", "properties": {"name": S, "address": {"type": "object", "properties": {
        "street": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "zip"]}},
        "required": ["name", "address"]}),
    ("list of objects", {"type": "object", "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 3,
                         "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 100},
                                                                    "label": S}, "required": ["id", "label"]}}},
                         "required": ["items"]}),
    ("enum of numbers", {"type": "object", "properties": {"stars": {"enum": [1, 2, 3, 4, 5]}}, "required": ["stars"]}),
    ("const", {"type": "object", "properties": {"version": {"const": "1.0"}, "ok": {"type": "boolean"}},
               "required": ["version", "ok"]}),
    ("optional field", {"type": "object", "properties": {"title": S, "subtitle": S}, "required": ["title"]}),
    ("anyOf", {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                                    {"type": "string", "maxLength": 5}]}},
               "required": ["value"]}),
    ("nullable", {"type": "object", "properties": {"middle_name": {"type": ["string", "null"], "maxLength": 12}},
                  "required": ["middle_name"]}),
    ("exclusive bounds", {"type": "object", "properties": {"p": {"type": "number", "exclusiveMinimum": 0,
                                                                 "exclusiveMaximum": 1}}, "required": ["p"]}),
    ("deep nesting", {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object",
                      "properties": {"c": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["c"]}},
                      "required": ["b"]}}, "required": ["a"]}),
    ("date pattern", {"type": "object", "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}},
                      "required": ["date"]}),
    ("recipe", {"type": "object", "properties": {"dish": S, "minutes": {"type": "integer", "minimum": 1, "maximum": 240},
                "vegetarian": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["quick", "easy", "spicy"]},
                                                            "maxItems": 3}},
                "required": ["dish", "minutes", "vegetarian", "tags"]}),
    ("matrix", {"type": "object", "properties": {"rows": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
        "required": ["rows"]}),
    ("event", {"type": "object", "properties": {"name": S, "attendees": {"type": "integer", "minimum": 1, "maximum": 500},
               "level": {"enum": ["low", "medium", "high"]}, "location": {"type": "object", "properties": {"city": S},
                                                                          "required": ["city"]}},
               "required": ["name", "attendees", "level", "location"]}),
]
assert len(SCHEMAS) == 20

for i, (name, schema) in enumerate(SCHEMAS):
    try:
        r = chat(f"Reply with a JSON example of a {name}.",
                 response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
        text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), schema)
        check(f"json_schema {name}", r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
    except Exception as e:  # noqa: BLE001 - reported, counted as a failure
        check(f"json_schema {name}", False, f"{type(e).__name__}: {e}")

# The same schema streamed: the deltas concatenate to valid JSON.
name, schema = SCHEMAS[17]
try:
    stream = chat("A recipe as JSON.", stream=True,
                  response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), schema)
    check("json_schema streamed", True)
except Exception as e:  # noqa: BLE001
    check("json_schema streamed", False, f"{type(e).__name__}: {e}")

try:
    r = chat("Give a JSON object with the keys name and age of a person.", response_format={"type": "json_object"})
    check("json_object", isinstance(json.loads(r.choices[0].message.content), dict))
except Exception as e:  # noqa: BLE001
    check("json_object", False, f"{type(e).__name__}: {e}")

for label, extra, valid in [
    ("structured_outputs regex", {"structured_outputs": {"regex": r"[0-9]{3}-[A-Z]{2}"}},
     lambda t: re.fullmatch(r"[0-9]{3}-[A-Z]{2}", t)),
    ("guided_regex", {"guided_regex": r"(yes|no), because [a-z ]{1,30}\."},
     lambda t: re.fullmatch(r"(yes|no), because [a-z ]{1,30}\.", t)),
    ("structured_outputs choice", {"structured_outputs": {"choice": ["Paris", "London", "Berlin"]}},
     lambda t: t in ("Paris", "London", "Berlin")),
    ("guided_choice", {"guided_choice": ["positive", "negative"]}, lambda t: t in ("positive", "negative")),
    ("structured_outputs grammar", {"structured_outputs": {"grammar": 'root ::= "The answer is " [0-9]+ "."'}},
     lambda t: re.fullmatch(r"The answer is [0-9]+\.", t)),
]:
    try:
        r = chat("What is the capital of France?", max_tokens=64, extra_body=extra)
        text = r.choices[0].message.content
        check(label, bool(valid(text)), repr(text))
    except Exception as e:  # noqa: BLE001
        check(label, False, f"{type(e).__name__}: {e}")

WEATHER = {"type": "object", "properties": {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}}]
PARAMS = {"get_weather": WEATHER, "add": ADD}
for label, choice in [("tool_choice required", "required"),
                      ("tool_choice named", {"type": "function", "function": {"name": "get_weather"}})]:
    try:
        r = chat("What is the weather in Paris?", tools=TOOLS, tool_choice=choice)
        calls = r.choices[0].message.tool_calls or []
        for c in calls:
            jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])
        named_ok = choice == "required" or all(c.function.name == "get_weather" for c in calls)
        check(label, len(calls) >= 1 and named_ok, repr(r.choices[0].message))
    except Exception as e:  # noqa: BLE001
        check(label, False, f"{type(e).__name__}: {e}")

try:
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=16, temperature=0, n=3)
    texts = [c.text for c in r.choices]
    check("n=3 completions greedy identical", len(texts) == 3 and len(set(texts)) == 1 and
          [c.index for c in r.choices] == [0, 1, 2], repr(texts))
    r = chat("Name a fruit.", max_tokens=16, n=3)
    texts = [c.message.content for c in r.choices]
    check("n=3 chat greedy identical", len(texts) == 3 and len(set(texts)) == 1, repr(texts))
except Exception as e:  # noqa: BLE001
    check("n=3", False, f"{type(e).__name__}: {e}")

try:
    chat("x", response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object",
         "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}}})
    check("invalid schema is 400", False, "accepted")
except openai.BadRequestError as e:
    check("invalid schema is 400", e.body.get("param") == "response_format" if isinstance(e.body, dict) else True,
          str(e.body))
except Exception as e:  # noqa: BLE001
    check("invalid schema is 400", False, f"{type(e).__name__}: {e}")

print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
