// The chat page: one conversation, sent whole on every turn to
// POST v1/chat/completions with stream: true; the answer is read as
// server-sent events from the response body as it arrives. A stream that
// breaks off (network, proxy) is picked up again with
// GET v1/chat/completions/{id}/stream and Last-Event-ID, so the text goes on
// where it stopped. URLs are relative: the page works under a path prefix.
"use strict";

const KEY_STORE = "mllama.apiKey";      // localStorage item of the API key
const RESUME_TRIES = 3;                 // reconnects of one broken stream
const RESUME_DELAY_MS = 500;            // wait before each reconnect

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"), maxTokens: $("max-tokens"), apiKey: $("api-key"),
  newChat: $("new-chat"), messages: $("messages"), error: $("error"),
  composer: $("composer"), prompt: $("prompt"), image: $("image"),
  imagePreview: $("image-preview"), imageClear: $("image-clear"),
  send: $("send"), stop: $("stop"),
  ttft: $("ttft"), tps: $("tps"), requestId: $("request-id"), status: $("status"),
};

const conversation = []; // OpenAI messages, sent whole each turn
let image = null;     // the attached image as a data URL, or null
let turn = null;      // the answer in flight (see send), or null

// An HTTP error answer (an OpenAI error object, or anything else) as one
// line; an ApiError is shown as it is, never retried.
class ApiError extends Error {}

function describe(e) {
  return (e.code ? e.code + ": " : "") + (e.message || "unknown error");
}

async function apiError(res) {
  const text = await res.text();
  try {
    const e = JSON.parse(text).error;
    if (e) return new ApiError(`${describe(e)} (HTTP ${res.status})`);
  } catch (_) { /* not JSON: shown raw below */ }
  return new ApiError(`HTTP ${res.status} ${res.statusText}: ${text.slice(0, 200)}`);
}

function headers(extra) {
  const h = Object.assign({}, extra);
  const key = ui.apiKey.value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function showError(text) {
  ui.error.textContent = text || "";
  ui.error.hidden = !text;
}

function setStatus(state) {
  ui.status.textContent = state;
  ui.status.dataset.state = state;
}

// ---- SSE ------------------------------------------------------------------

// text/event-stream as the HTML standard parses it: lines end in \n, \r\n or
// \r; an empty line dispatches the event; "id" sets the last event id, "data"
// lines join with \n, comments (": keep-alive") and other fields are skipped.
class SseParser {
  constructor() { this.buf = ""; this.id = null; this.data = []; }

  // Feeds decoded text; returns the events it completed, as {id, data}.
  push(text) {
    this.buf += text;
    const events = [];
    // A \r at the very end may be the first half of \r\n: wait for more.
    const eol = /\r\n|\n|\r(?!$)/g;
    let start = 0, m;
    while ((m = eol.exec(this.buf)) !== null) {
      this.line(this.buf.slice(start, m.index), events);
      start = eol.lastIndex;
    }
    this.buf = this.buf.slice(start);
    return events;
  }

  line(line, events) {
    if (line === "") {
      if (this.data.length) events.push({ id: this.id, data: this.data.join("\n") });
      this.data = [];
      return;
    }
    if (line[0] === ":") return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "id") this.id = value;
  }
}

// Reads one response's events into the turn. Returns true at data: [DONE],
// false when the body ended before it; throws what the network throws.
async function readEvents(t, res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  const sse = new SseParser();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    for (const ev of sse.push(decoder.decode(value, { stream: true }))) {
      if (ev.id !== null) t.lastEventId = ev.id;
      if (ev.data === "[DONE]") return true;
      onChunk(t, JSON.parse(ev.data));
    }
  }
}

// Follows the turn's stream to [DONE], reconnecting with Last-Event-ID when
// the connection breaks (a TypeError is fetch's network error).
async function follow(t, res) {
  let lost = null;
  for (let tries = 0; tries <= RESUME_TRIES; tries++) {
    try {
      if (!res) res = await resume(t);
      if (await readEvents(t, res)) return;
      lost = new Error("the stream ended before [DONE]");
    } catch (e) {
      if (!(e instanceof TypeError)) throw e;
      lost = e;
    }
    if (!t.id) break;
    res = null;
    setStatus("reconnecting");
    await new Promise((ok) => setTimeout(ok, RESUME_DELAY_MS));
  }
  throw new Error(`connection lost: ${lost.message}`);
}

async function resume(t) {
  const h = t.lastEventId === null ? {} : { "Last-Event-ID": t.lastEventId };
  const res = await fetch(`v1/chat/completions/${encodeURIComponent(t.id)}/stream`,
                          { headers: headers(h), signal: t.controller.signal });
  if (!res.ok) throw await apiError(res);
  setStatus("streaming");
  return res;
}

// ---- one turn -------------------------------------------------------------

function setRequestId(t, id) {
  if (!id || t.id === id) return;
  t.id = id;
  ui.requestId.value = id;
}

function onChunk(t, chunk) {
  if (chunk.error) {            // an error after the 200: [DONE] follows
    t.error = describe(chunk.error);
    return;
  }
  setRequestId(t, chunk.id);
  if (chunk.usage) t.usage = chunk.usage;
  for (const choice of chunk.choices || []) {
    const piece = choice.delta && choice.delta.content;
    if (piece) {
      const now = performance.now();
      if (t.firstAt === null) {
        t.firstAt = now;
        ui.ttft.value = `${Math.round(now - t.sentAt)} ms`;
        setStatus("streaming");
      }
      t.lastAt = now;
      t.chunks++;
      t.text += piece;
      t.out.textContent = t.text;
      ui.tps.value = rate(t, t.chunks);
      ui.messages.scrollTop = ui.messages.scrollHeight;
    }
    if (choice.finish_reason) t.finish = choice.finish_reason;
  }
}

// Decode speed: tokens after the first over the time since the first.
function rate(t, tokens) {
  const s = (t.lastAt - t.firstAt) / 1000;
  return tokens > 1 && s > 0 ? ((tokens - 1) / s).toFixed(1) : "–";
}

function addMessage(role, text, imageUrl) {
  const li = document.createElement("li");
  li.className = `msg ${role}`;
  const who = document.createElement("span");
  who.className = "role";
  who.textContent = role === "user" ? "You" : "Assistant";
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  li.append(who, body);
  if (imageUrl) {
    const img = document.createElement("img");
    img.src = imageUrl;
    img.alt = "image sent with this message";
    li.append(img);
  }
  ui.messages.append(li);
  ui.messages.scrollTop = ui.messages.scrollHeight;
  return { li, body };
}

async function send(ev) {
  ev.preventDefault();
  const text = ui.prompt.value.trim();
  if (turn || !text) return;
  const content = image
    ? [{ type: "text", text }, { type: "image_url", image_url: { url: image } }]
    : text;
  conversation.push({ role: "user", content });
  addMessage("user", text, image);
  ui.prompt.value = "";
  clearImage();

  const answer = addMessage("assistant", "");
  answer.li.dataset.state = "waiting";
  // Screen readers announce the answer once, when it is whole, not per token.
  answer.li.setAttribute("aria-busy", "true");
  const t = turn = {
    controller: new AbortController(), id: null, lastEventId: null,
    li: answer.li, out: answer.body, text: "", chunks: 0, usage: null,
    finish: null, error: null, sentAt: performance.now(), firstAt: null, lastAt: null,
  };
  showError("");
  ui.ttft.value = ui.tps.value = ui.requestId.value = "–";
  setStatus("waiting");
  setBusy(true);

  const body = { messages: conversation, stream: true, stream_options: { include_usage: true } };
  if (ui.model.value) body.model = ui.model.value;
  const maxTokens = parseInt(ui.maxTokens.value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;

  let state = "done";
  try {
    const res = await fetch("v1/chat/completions", {
      method: "POST", body: JSON.stringify(body), signal: t.controller.signal,
      headers: headers({ "Content-Type": "application/json" }),
    });
    setRequestId(t, res.headers.get("X-Request-Id"));
    if (!res.ok) throw await apiError(res);
    await follow(t, res);
    if (t.error) throw new ApiError(t.error);
  } catch (e) {
    state = e.name === "AbortError" ? "stopped" : "error";
    if (state === "error") showError(e.message);
  }
  finish(t, state);
}

function finish(t, state) {
  const tokens = t.usage ? t.usage.completion_tokens : t.chunks;
  if (t.firstAt !== null) ui.tps.value = rate(t, tokens);
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = [
    `${tokens} tokens`,
    t.firstAt === null ? null : `${ui.tps.value} tok/s`,
    t.finish === "length" ? "cut at max tokens" : t.finish,
    state === "done" ? null : state,
  ].filter(Boolean).join(" · ");
  t.li.append(meta);
  // A turn that produced text stays in the conversation, even stopped; one
  // that produced none takes its question back out, so the next turn does
  // not carry a request the service refused.
  if (t.text) conversation.push({ role: "assistant", content: t.text });
  else conversation.pop();
  t.li.dataset.state = state;
  t.li.removeAttribute("aria-busy");
  setStatus(state);
  turn = null;
  setBusy(false);
  ui.prompt.focus();
}

function stop() {
  if (!turn) return;
  const t = turn;
  t.controller.abort();
  // The abort closes the connection; the cancel frees the worker at once
  // instead of after the gateway's abandon timeout.
  if (t.id) {
    fetch(`v1/chat/completions/${encodeURIComponent(t.id)}/cancel`,
          { method: "POST", headers: headers() }).catch(() => {});
  }
}

function setBusy(busy) {
  ui.send.disabled = busy;
  ui.stop.disabled = !busy;
}

// ---- controls -------------------------------------------------------------

async function loadModels() {
  try {
    const res = await fetch("v1/models", { headers: headers() });
    if (!res.ok) throw await apiError(res);
    const models = (await res.json()).data || [];
    const keep = ui.model.value;
    ui.model.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
    if (models.some((m) => m.id === keep)) ui.model.value = keep;
    ui.model.dataset.loaded = String(models.length);
  } catch (e) {
    showError(`models: ${e.message}`);
  }
}

function clearImage() {
  image = null;
  ui.image.value = "";
  ui.imagePreview.hidden = ui.imageClear.hidden = true;
  ui.imagePreview.removeAttribute("src");
}

function attachImage() {
  const file = ui.image.files[0];
  if (!file) return clearImage();
  const reader = new FileReader();
  reader.onload = () => {
    image = reader.result;
    ui.imagePreview.src = image;
    ui.imagePreview.hidden = ui.imageClear.hidden = false;
  };
  reader.onerror = () => showError(`image: ${reader.error.message}`);
  reader.readAsDataURL(file);
}

function newChat() {
  stop();
  conversation.length = 0;
  ui.messages.replaceChildren();
  ui.ttft.value = ui.tps.value = ui.requestId.value = "–";
  showError("");
  setStatus("idle");
}

ui.apiKey.value = localStorage.getItem(KEY_STORE) || "";
ui.apiKey.addEventListener("change", () => {
  const key = ui.apiKey.value.trim();
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
  showError("");
  loadModels();
});
ui.composer.addEventListener("submit", send);
ui.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    ui.composer.requestSubmit();
  }
});
ui.stop.addEventListener("click", stop);
ui.image.addEventListener("change", attachImage);
ui.imageClear.addEventListener("click", clearImage);
ui.newChat.addEventListener("click", newChat);
loadModels();
