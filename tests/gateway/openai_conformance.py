"""The gateway as OpenAI's official Python client sees it, and as curl -N sees
the bytes: models.list; a chat completion with an image, non-streamed and
streamed (chunk shapes, one id, finish_reason, usage only with
stream_options.include_usage); an image sent as an http URL that the gateway
fetches, answered as the same bytes inline; n choices; a required tool call (its
arguments valid, the streamed delta.tool_calls equal to the message's) and
the history sent back as the client holds it; errors as the client's
exception classes; the exact SSE framing (`id: n`, `data: ...`, `data:
[DONE]`) and its headers; a finished stream read again with Last-Event-ID.

    openai_conformance.py --base-url http://127.0.0.1:PORT --image FILE [--api-key KEY]

With --api-key the gateway is expected to require keys (a wrong one is a 401).
Prints every failed check and "N checks, M failures"; exit 1 on any failure.
"""
import argparse
import base64
import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading

import openai

from checks import check, summary

MAX_TOKENS = 12     # enough for several chunks, short on the CPU micro model
SEED = 1234         # the same seed gives the same text streamed or not
TIMEOUT_S = 120     # one request, on a loaded CI machine
REQUEST_ID = re.compile(r"chatcmpl-[0-9a-f]{32}")
WORKER_FIELDS = ("seq", "attempt", "timings")  # the worker's, never the client's


def image_message(path, text, media_type="image/jpeg"):
    with open(path, "rb") as f:
        url = "data:%s;base64,%s" % (media_type, base64.b64encode(f.read()).decode())
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": url}}]}


def test_models(client):
    models = client.models.list().data
    check(len(models) >= 1, "models.list has the base model")
    for m in models:
        check(isinstance(m.id, str) and m.id and m.object == "model", f"model entry {m}")
    return models[0].id


def test_non_stream(client, model, messages):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                       seed=SEED)
    check(REQUEST_ID.fullmatch(r.id or ""), f"completion id {r.id!r}")
    check(r.object == "chat.completion", f"object {r.object!r}")
    check(r.model == model, f"model echoed: {r.model!r}")
    check(len(r.choices) == 1, "one choice")
    c = r.choices[0]
    check(c.index == 0 and c.message.role == "assistant", "choice 0, role assistant")
    check(isinstance(c.message.content, str), "content is a string")
    check(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}")
    u = r.usage
    check(u is not None and u.completion_tokens >= 1 and u.prompt_tokens >= 1
          and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
    check(u is not None and u.prompt_tokens_details is not None
          and u.prompt_tokens_details.cached_tokens is not None, "usage.cached_tokens")
    check(not any(k in (r.model_extra or {}) for k in WORKER_FIELDS),
          f"no worker fields: {r.model_extra}")
    return c.message.content, c.finish_reason


def test_image_formats(client, model, webp, gif):
    """WebP and GIF images, which OpenAI's API takes besides PNG and JPEG."""
    for path, media_type in ((webp, "image/webp"), (gif, "image/gif")):
        r = client.chat.completions.create(
            model=model, messages=[image_message(path, "What is this?", media_type)],
            max_tokens=2)
        c = r.choices[0]
        check(isinstance(c.message.content, str) and c.finish_reason in ("stop", "length"),
              f"a {media_type} image is answered: {c.finish_reason!r}")


def test_image_url(client, model, path):
    """The image as an http URL (the gateway of run.sh fetches http and loopback): the
    same text as the same bytes inline, under one seed; the official client's image_url
    object with its `detail` passes as it is."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=os.path.dirname(os.path.abspath(path)))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d/%s" % (server.server_port, os.path.basename(path))
        by_url = {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}]}
        texts = [client.chat.completions.create(model=model, messages=[m], max_tokens=4,
                                                seed=SEED).choices[0].message.content
                 for m in (by_url, image_message(path, "What is this?"))]
        check(texts[0] == texts[1], f"an image URL answers as its bytes inline: {texts}")
        try:
            missing = dict(by_url, content=[{"type": "image_url",
                                             "image_url": {"url": url + ".missing"}}])
            client.chat.completions.create(model=model, messages=[missing], max_tokens=2)
            check(False, "a URL answering 404 is refused")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            check(body.get("code") == "invalid_image_url" and "HTTP 404" in body.get("message", ""),
                  f"a 404 URL: BadRequestError invalid_image_url: {e.body}")
    finally:
        server.shutdown()
        server.server_close()


def test_stream(client, model, messages, include_usage):
    kw = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(client.chat.completions.create(model=model, messages=messages,
                                                 max_tokens=MAX_TOKENS, seed=SEED,
                                                 stream=True, **kw))
    what = f"stream (include_usage={include_usage})"
    check(len(chunks) >= 2, f"{what}: {len(chunks)} chunks")
    ids = {c.id for c in chunks}
    check(len(ids) == 1 and REQUEST_ID.fullmatch(next(iter(ids))), f"{what}: one id {ids}")
    text, finish, usage = "", [], []
    for c in chunks:
        check(c.object == "chat.completion.chunk" and c.model == model and c.created > 0,
              f"{what}: chunk head {c.object} {c.model} {c.created}")
        check(not any(k in (c.model_extra or {}) for k in WORKER_FIELDS),
              f"{what}: no worker fields: {c.model_extra}")
        for ch in c.choices:
            check(ch.index == 0, f"{what}: choice index {ch.index}")
            text += ch.delta.content or ""
            if ch.finish_reason:
                finish.append(ch.finish_reason)
        if c.usage is not None:
            usage.append(c)
    check(len(finish) == 1 and finish[0] in ("stop", "length"), f"{what}: finish {finish}")
    if include_usage:
        last = chunks[-1]
        check(len(usage) == 1 and usage[0] is last and last.choices == [],
              f"{what}: usage only on a last chunk without choices")
        check(last.usage.completion_tokens >= 1 and last.usage.total_tokens ==
              last.usage.prompt_tokens + last.usage.completion_tokens, f"{what}: {last.usage}")
    else:
        check(not usage and all(c.choices for c in chunks), f"{what}: no usage chunk")
    return text, finish[0] if finish else None


TOOL_TOKENS = 64    # a call of WEATHER is about 20 tokens
N_CHOICES = 2
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The forecast for a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}


def valid_weather_arguments(text):
    """WEATHER's parameters, checked here rather than by the gateway's grammar."""
    try:
        args = json.loads(text)
    except (TypeError, ValueError):
        return False
    return (isinstance(args, dict) and set(args) == {"city", "days"}
            and args["city"] in ("Paris", "Oslo") and type(args["days"]) is int
            and 1 <= args["days"] <= 7)


def test_tools(client, model):
    """tool_choice required: a valid call, the same streamed; the history with the
    call and a tool result, as the client's own objects dump it, answered in text."""
    msgs = [{"role": "user", "content": "What is the weather in Oslo this week?"}]
    kw = dict(model=model, messages=msgs, tools=[WEATHER], tool_choice="required",
              max_tokens=TOOL_TOKENS, seed=SEED)
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    calls = c.message.tool_calls or []
    check(c.finish_reason == "tool_calls" and len(calls) == 1 and c.message.content is None,
          f"tools: finish {c.finish_reason!r}, {len(calls)} calls, content {c.message.content!r}")
    if len(calls) != 1:
        return
    call = calls[0]
    check(call.type == "function" and call.id.startswith("call_")
          and call.function.name == "get_weather"
          and valid_weather_arguments(call.function.arguments),
          f"tools: the call {call}")
    cid, name, args, finish = None, None, "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                check(tc.index == 0, f"tools stream: call index {tc.index}")
                cid = tc.id or cid
                name = (tc.function and tc.function.name) or name
                args += (tc.function and tc.function.arguments) or ""
            finish = ch.finish_reason or finish
    # The same seed, the same call; the id is the request's own (each request is another).
    check((name, args, finish) == (call.function.name, call.function.arguments, "tool_calls")
          and cid and cid.startswith("call_") and cid != call.id,
          f"tools stream: {(cid, name, args, finish)} vs the message's {call}")
    history = msgs + [c.message.model_dump(),
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 4}'}]
    r = client.chat.completions.create(model=model, messages=history, tools=[WEATHER],
                                       tool_choice="none", max_tokens=MAX_TOKENS, seed=SEED)
    c = r.choices[0]
    check(isinstance(c.message.content, str) and not c.message.tool_calls
          and c.finish_reason in ("stop", "length"),
          f"tools: the history answered in text: {c.message}")


def test_choices(client, model, messages):
    """n choices: n messages, indexes 0..n-1, the prompt counted once."""
    one = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                         seed=SEED)
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                       seed=SEED, n=N_CHOICES)
    check([c.index for c in r.choices] == list(range(N_CHOICES))
          and all(isinstance(c.message.content, str) for c in r.choices),
          f"n {N_CHOICES}: choices {[c.index for c in r.choices]}")
    check(r.usage.prompt_tokens == one.usage.prompt_tokens
          and r.choices[0].message.content == one.choices[0].message.content,
          f"n {N_CHOICES}: the prompt once ({r.usage.prompt_tokens} vs "
          f"{one.usage.prompt_tokens}), choice 0 the n 1 answer")


def test_errors(client, model, base_url, api_key):
    def expect(exc, status, **kw):
        try:
            client.chat.completions.create(model=kw.pop("model", model), max_tokens=4, **kw)
            check(False, f"{kw}: no error, want {exc.__name__}")
        except exc as e:
            check(e.status_code == status, f"{exc.__name__}: status {e.status_code}")
            check(isinstance(e.body, dict) and e.body.get("code") and e.body.get("message"),
                  f"{exc.__name__}: an OpenAI error object: {e.body}")
            return e.body
        except openai.APIError as e:
            check(False, f"{kw}: {type(e).__name__} {e}, want {exc.__name__}")

    expect(openai.BadRequestError, 400, messages=[])
    body = expect(openai.BadRequestError, 400, messages=[{
        "role": "user", "content": [{"type": "text", "text": "what is this?"},
                                    {"type": "image_url",
                                     "image_url": {"url": "data:image/jpeg;base64,AAAA"}}]}])
    check(body is None or body.get("code") == "invalid_image", f"invalid_image: {body}")
    expect(openai.NotFoundError, 404, model="no-such-model",
           messages=[{"role": "user", "content": "hi"}])
    if api_key:
        wrong = openai.OpenAI(base_url=base_url, api_key="mk-wrong", max_retries=0,
                              timeout=TIMEOUT_S)
        try:
            wrong.models.list()
            check(False, "a wrong key is refused")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, f"wrong key: status {e.status_code}")


# ---- the bytes, as curl -N sees them ----------------------------------------

SSE_EVENT = re.compile(rb"id: (\d+)\ndata: ([^\n]*)\n\n|: [^\n]*\n\n")


def curl(base_url, api_key, path, body=None, headers=()):
    """Returns (status, headers as a lower-cased dict, body bytes)."""
    cmd = ["curl", "-N", "-sS", "-D", "-", "--max-time", str(TIMEOUT_S), base_url + path]
    for h in headers:
        cmd += ["-H", h]
    if api_key:
        cmd += ["-H", f"Authorization: Bearer {api_key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    out = subprocess.run(cmd, input=body, capture_output=True, check=True).stdout
    head, _, payload = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, payload


def test_sse_framing(base_url, api_key, model, messages):
    body = json.dumps({"model": model, "messages": messages, "max_tokens": MAX_TOKENS,
                       "seed": SEED, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    status, h, payload = curl(base_url, api_key, "/v1/chat/completions", body)
    check(status == 200, f"SSE: status {status}")
    check(h.get("content-type", "").startswith("text/event-stream"), f"SSE: {h}")
    check(h.get("cache-control") == "no-cache", f"SSE: cache-control {h.get('cache-control')}")
    check(h.get("x-accel-buffering") == "no", "SSE: X-Accel-Buffering: no")
    rid = h.get("x-request-id", "")
    check(REQUEST_ID.fullmatch(rid), f"SSE: X-Request-Id {rid!r}")
    ids, data = parse_sse(payload, "SSE")
    check(ids == list(range(len(ids))), f"SSE: ids 0, 1, 2, ...: {ids}")
    check(data and data[-1] == b"[DONE]", "SSE: data: [DONE] is the last event")
    for d in data[:-1]:
        obj = json.loads(d)
        check(obj.get("id") == rid and obj.get("object") == "chat.completion.chunk",
              f"SSE: chunk {d[:120]!r}")
    return rid, ids, data


def parse_sse(payload, what):
    """The (ids, data) of an SSE body; checks that every byte is an event."""
    at, ids, data = 0, [], []
    for m in SSE_EVENT.finditer(payload):
        if m.start() != at:
            break
        at = m.end()
        if m.group(1) is not None:
            ids.append(int(m.group(1)))
            data.append(m.group(2))
    check(at == len(payload), f"{what}: every byte is an event; unparsed from {at}: "
                              f"{payload[at:at + 80]!r}")
    return ids, data


def test_resume(base_url, api_key, rid, ids, data):
    """GET .../{id}/stream after the stream ended: with Last-Event-ID: n the
    events after n, without it all of them, byte for byte the same."""
    path = f"/v1/chat/completions/{rid}/stream"
    for last in (None, 0, len(ids) // 2):
        hdr = () if last is None else (f"Last-Event-ID: {last}",)
        status, h, payload = curl(base_url, api_key, path, headers=hdr)
        what = f"resume after {last}"
        check(status == 200 and h.get("content-type", "").startswith("text/event-stream"),
              f"{what}: {status} {h.get('content-type')}")
        got_ids, got_data = parse_sse(payload, what)
        start = 0 if last is None else last + 1
        check(got_ids == ids[start:] and got_data == data[start:],
              f"{what}: events {got_ids}, want {ids[start:]}")
    status, _, _ = curl(base_url, api_key, "/v1/chat/completions/chatcmpl-" + "0" * 32 + "/stream")
    check(status == 404, f"resume of an unknown id: {status}")


def test_http_surface(base_url, api_key):
    status, h, page = curl(base_url, api_key, "/")
    check(status == 200 and h.get("content-type", "").startswith("text/html")
          and b"chat.js" in page, f"GET /: {status} {h.get('content-type')}")
    status, h, _ = curl(base_url, api_key, "/chat.js")
    check(status == 200 and "javascript" in h.get("content-type", ""), f"GET /chat.js: {status}")
    status, h, body = curl(base_url, api_key, "/v1/chat/completions", b"{not json")
    check(status == 400 and json.loads(body)["error"]["code"] == "invalid_json",
          f"bad JSON: {status} {body[:200]!r}")
    status, h, body = curl(base_url, api_key, "/v1/no-such-route")
    check(status == 404 and "error" in json.loads(body), f"unknown route: {status} {body[:200]!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True, help="http://host:port (no /v1)")
    ap.add_argument("--image", required=True, help="a JPEG sent as a data URL")
    ap.add_argument("--webp", required=True, help="a still WebP sent as a data URL")
    ap.add_argument("--gif", required=True, help="a GIF sent as a data URL")
    ap.add_argument("--api-key", default="", help="a valid key; the gateway requires keys")
    args = ap.parse_args()
    base = args.base_url.rstrip("/")
    client = openai.OpenAI(base_url=base + "/v1", api_key=args.api_key or "unused",
                           max_retries=0, timeout=TIMEOUT_S)
    messages = [image_message(args.image, "Describe this image in one sentence.")]

    model = test_models(client)
    text, finish = test_non_stream(client, model, messages)
    streamed, stream_finish = test_stream(client, model, messages, include_usage=True)
    check(streamed == text and stream_finish == finish,
          f"same seed, same text streamed or not: {streamed!r} vs {text!r}")
    test_stream(client, model, messages, include_usage=False)
    test_choices(client, model, messages)
    test_image_formats(client, model, args.webp, args.gif)
    test_image_url(client, model, args.image)
    test_tools(client, model)
    test_errors(client, model, base + "/v1", args.api_key)
    test_resume(base, args.api_key, *test_sse_framing(base, args.api_key, model, messages))
    test_http_surface(base, args.api_key)
    print(f"openai_conformance: model {model}, answer {text!r} ({finish})")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
