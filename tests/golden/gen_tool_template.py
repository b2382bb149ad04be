#!/usr/bin/env python3
"""Reference prompts and ids for the chat template's tool branches (test_chat_template.c).

    python3 -m venv /tmp/tplvenv
    /tmp/tplvenv/bin/pip install transformers==4.47.1 tokenizers==0.21.4 jinja2==3.1.6
    /tmp/tplvenv/bin/python tests/golden/gen_tool_template.py [REPO_ROOT]

(torch is not needed: only the tokenizer and apply_chat_template run.)

Renders each case below with transformers' apply_chat_template, the chat template
being fixtures/tokenizer/llama32_vision_chat_template.jinja (its first line, which
says where the text comes from, dropped), then tokenizer(prompt,
add_special_tokens=False). The tokenizer is config/tokenizer/tokenizer.json plus
<|image|>, as tokenizer_refs.py builds it, wrapped in a PreTrainedTokenizerFast
with <|begin_of_text|> as bos_token.

Writes fixtures/tokenizer/chat_tools.json: the versions, and per case
  "tools":    the tools as the client wrote them (JSON texts); the template gets
              json.loads of each,
  "messages": per message the C side's inputs: "role", "text" (one text part)
              or none, "tool_call" {"name", "arguments": JSON text} for an
              assistant call (the template gets arguments as the parsed dict,
              as transformers documents), "content_json" (JSON text) for a tool
              result (the template gets json.loads of it),
  "date_string", "add_generation_prompt", "prompt", "ids".
"""
import hashlib
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "fixtures", "tokenizer", "llama32_vision_chat_template.jinja")
OUT = os.path.join(HERE, "fixtures", "tokenizer", "chat_tools.json")
DATE = "26 Jul 2024"
PINNED = {"transformers": "4.47.1", "tokenizers": "0.21.4"}

WEATHER = ('{"type": "function", "function": {"name": "get_weather", "description": '
           '"Get the current weather in a city", "parameters": {"type": "object", '
           '"properties": {"city": {"type": "string", "description": "The city, e.g. '
           '\\"Paris\\""}}, "required": ["city"]}}}')

# Written compactly and with odd spacing on purpose: tojson writes its own.
SEARCH = ('{"type":"function","function":{"name":"search_hotels","description":'
          '"Cherche des h\\u00f4tels \\u00e0 proximit\\u00e9 \\u2014 \u00e9t\u00e9 \U0001f3e8",'
          '"parameters":{"type":"object","properties":{'
          '"location":{"type":"object","properties":{"lat":{"type":"number","minimum":-90.0,'
          '"maximum":90},"lon":{"type":"number"}},"required":["lat","lon"]},'
          '"radius_km":{"type":"number","default":0.5,"maximum":1E2},'
          '"stars":{"type":"integer","enum":[1,2,3,4,5]},'
          '"sort":{"type":"string","enum":["price","rating","distance"]},'
          '"weights":{"type":"array","items":{"type":"number"},"default":[1.0,0.25,1e-05,-0]},'
          '"note":{"type":"string","description":"tab\\there, a \\"quote\\", a back\\\\slash\\/"}},'
          '"required":["location"]}}}')

CONVERT = ('{ "type" : "function" , "function" : { "name" : "convert" , "parameters" : '
           '{ "type" : "object" , "properties" : { } } , "strict" : true , "extra" : null , '
           '"big" : 12345678901234567890123 , "tiny" : 1.5e-7 , "huge" : 2e16 } }')

CASES = [
    {
        "name": "tools with a system message",
        "tools": [WEATHER],
        "messages": [
            {"role": "system", "text": "  You are a helpful assistant.\n"},
            {"role": "user", "text": "\n What is the weather in Paris?  "},
        ],
    },
    {
        "name": "tools without a system message",
        "tools": [WEATHER],
        "messages": [{"role": "user", "text": "Weather in Lyon?"}],
    },
    {
        "name": "history with calls and results",
        "tools": [WEATHER],
        "messages": [
            {"role": "system", "text": "Answer briefly."},
            {"role": "user", "text": "Weather in Paris and Nice?"},
            {"role": "assistant",
             "tool_call": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"role": "tool", "content_json": '"22 degrees, sunny"'},
            {"role": "assistant",
             "tool_call": {"name": "get_weather",
                           "arguments": '{"city": "Nice", "days": 3, "threshold": 0.5, '
                                        '"units": {"temp": "celsius", "extra": [1.0, null, '
                                        'true]}, "note": "caf\\u00e9 \\"x\\""}'}},
            {"role": "tool",
             "content_json": '"{\\"temperature\\": 25.0, \\"unit\\": \\"celsius\\"}"'},
            {"role": "assistant", "text": "Paris: 22, sunny. Nice: 25."},
            {"role": "user", "text": "Thanks! And Lille?"},
            {"role": "assistant",
             "tool_call": {"name": "get_weather", "arguments": '{"city": "Lille"}'}},
            {"role": "ipython",
             "content_json": '[{"type": "text", "text": "12 degrees\\nrain"}]'},
        ],
    },
    {
        "name": "several tools",
        "tools": [WEATHER, SEARCH, CONVERT],
        "messages": [
            {"role": "system", "text": "Use the tools."},
            {"role": "user", "text": "Find a h\u00f4tel near 48.85, 2.35 \u2014 4 stars."},
        ],
    },
    {
        "name": "no tools",
        "tools": [],
        "messages": [
            {"role": "system", "text": "Be brief."},
            {"role": "user", "text": "Hi"},
        ],
    },
]


def load_refs():
    spec = importlib.util.spec_from_file_location(
        "tokenizer_refs", os.path.join(HERE, "tokenizer_refs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def published_template():
    with open(TEMPLATE, encoding="utf-8") as f:
        first, rest = f.read().split("\n", 1)
    if not first.startswith("{#-"):
        raise RuntimeError("%s: the first line should be the provenance comment" % TEMPLATE)
    return rest


def hf_message(m):
    """The message as transformers gets it."""
    if "tool_call" in m:
        call = m["tool_call"]
        return {"role": m["role"], "tool_calls": [{"type": "function", "function": {
            "name": call["name"], "arguments": json.loads(call["arguments"])}}]}
    if "content_json" in m:
        return {"role": m["role"], "content": json.loads(m["content_json"])}
    return {"role": m["role"], "content": m["text"]}


def main(repo_root):
    import tokenizers
    import transformers
    from transformers import PreTrainedTokenizerFast

    got = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
    if got != PINNED:
        raise RuntimeError("versions %r, the fixtures are made with %r" % (got, PINNED))
    tok = PreTrainedTokenizerFast(tokenizer_object=load_refs().load_reference_tokenizer(repo_root),
                                  bos_token="<|begin_of_text|>")
    template = published_template()
    cases = []
    for case in CASES:
        prompt = tok.apply_chat_template(
            [hf_message(m) for m in case["messages"]],
            tools=[json.loads(t) for t in case["tools"]] or None,
            chat_template=template, date_string=DATE, add_generation_prompt=True,
            tokenize=False)
        ids = tok(prompt, add_special_tokens=False).input_ids
        cases.append(dict(case, date_string=DATE, add_generation_prompt=True, prompt=prompt,
                          ids=ids))
    with open(TEMPLATE, "rb") as f:
        template_sha = hashlib.sha256(f.read()).hexdigest()
    doc = {
        "generator": "tests/golden/gen_tool_template.py",
        "versions": dict(got, jinja2=__import__("jinja2").__version__,
                         python=sys.version.split()[0]),
        "template_sha256": template_sha,
        "render": "apply_chat_template(messages, tools=tools or None, date_string=..., "
                  "add_generation_prompt=True, tokenize=False)",
        "encode": "tokenizer(prompt, add_special_tokens=False).input_ids",
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(HERE)))
