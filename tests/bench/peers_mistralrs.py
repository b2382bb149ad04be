#!/usr/bin/env python3
"""mistral.rs side of tests/bench/peers.sh: time mistralrs (the PyPI CPU wheel)
on the mllama checkpoint, loaded as it is (Which.MultimodalPlain, arch
MultimodalArchitecture.VLlama), and print "key value" lines with the keys of
engine_hf.py under the prefix mistralrs_<dtype>_.

    python peers_mistralrs.py --model DIR --dtype f32|bf16 --image IMG --cold-image IMG
        [--prompt TEXT] [--throughput-prompt TEXT] [--max-tokens N] [--repeats N]
        [--concurrency "1 4 8 16"]

Threads: the caller sets RAYON_NUM_THREADS (candle's CPU kernels run on rayon's
pool; peers_report.py exec counts the threads that did the work). Requests
are greedy (temperature 0) with ignore_eos, so every one generates
--max-tokens tokens. The prefix cache is off (prefix_cache_n=0): repeats of
the same request would otherwise skip their prefill.

  ready_s            process start to the Runner ready (imports included)
  text_ttft_ms       chat request --prompt, no image: request sent to the
                     first streamed token
  text_ms_per_token  the same request: time between the first and the last
                     streamed token over the tokens after the first
  text_prompt_tokens its prompt's length as mistralrs counts it (its own
                     chat template from tokenizer_config.json)
  tps_<B>            completion tokens/s of B streamed text requests
                     (--throughput-prompt "(request i)") submitted at once;
                     the Runner schedules them together (max_seqs >= B);
                     wall until the last one ends, prefill included
  cold_ttft_ms       the first image request of the process (--cold-image, a
                     different image of the same size)
  ttft_ms            an image request (--image): image preprocessing, vision,
                     prefill, first token
Text figures: best of --repeats after one warm-up request; tps_<B>: best of
--repeats.

Image requests generate one token (max_tokens 1, so TTFT is the request's
wall time) and run last: in mistralrs 0.9.5 the decode step after an mllama
image prefill panics (vision_models/mllama/inputs_processor.rs: each step
builds a fresh inputs processor, whose `max_image_tiles` only its own image
preprocessing sets, and a decode step reuses the pixels cached by the
prefill: "`max_image_tiles` must be set!"), which ends the engine thread.
So decode with an image has no mistralrs figure. Its encoder cache (which
cannot be turned off: encoder_cache_memory_bytes must be nonzero) would
serve a repeated image without the vision tower, so every timed image
request gets its own copy of --image with one pixel changed (lossless PNG,
same size and tiles).
"""
import argparse
import os
import sys
import tempfile
import time

from peers_report import process_age_s


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", choices=["bf16", "f32"], required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--cold-image", required=True)
    p.add_argument("--prompt", default="Describe this image in detail.")
    p.add_argument("--throughput-prompt", default="Write a short story")
    p.add_argument("--max-tokens", type=int, default=33)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", default="1 4 8 16")
    return p.parse_args()


def image_variant(path, i, folder):
    """A copy of the image at path with its first pixel set to i: another
    image to the encoder cache, the same size and tiles to the model."""
    from PIL import Image
    img = Image.open(path).convert("RGB")
    img.putpixel((0, 0), (i, i, i))
    out = os.path.join(folder, "variant_%d.png" % i)
    img.save(out)
    return out


def main():
    args = parse_args()
    # mistralrs logs to stdout; the results keep stdout to themselves.
    results = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from importlib.metadata import version
    from mistralrs import (ChatCompletionRequest, ModelDType, MultimodalArchitecture, Runner,
                           Which)

    dtype = {"bf16": ModelDType.BF16, "f32": ModelDType.F32}[args.dtype]
    concurrency = [int(b) for b in args.concurrency.split()]
    runner = Runner(which=Which.MultimodalPlain(model_id=args.model,
                                                arch=MultimodalArchitecture.VLlama, dtype=dtype),
                    max_seqs=max(concurrency), prefix_cache_n=0)
    ready_s = process_age_s()

    def request(text, image=None, stream=False, max_tokens=args.max_tokens):
        content = text
        if image:
            # The checkpoint's chat template writes <|image|> only for content
            # of type "image", which mistralrs' messages do not carry: the
            # token goes in the text, where the template would put it (as
            # mistral.rs' own Llama 3.2 Vision examples do).
            content = [{"type": "image_url", "image_url": {"url": image}},
                       {"type": "text", "text": "<|image|>" + text}]
        return ChatCompletionRequest(model="mllama", messages=[{"role": "user",
                                                                 "content": content}],
                                     max_tokens=max_tokens, temperature=0.0, stream=stream,
                                     ignore_eos=True)

    def drain(stream):
        """(arrival time of each streamed chunk with text, tokens generated)."""
        stamps, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps.append(time.perf_counter())
            usage = chunk.usage or usage
        if not stamps:
            sys.exit("mistralrs streamed no token")
        # A chunk may carry more than one token; usage counts them all.
        return stamps, usage.completion_tokens if usage else len(stamps), usage

    def timed(text):
        """(ttft ms, ms per token after the first, prompt tokens) of one
        streamed text request."""
        t0 = time.perf_counter()
        stamps, n, usage = drain(runner.send_chat_completion_request(request(text, stream=True)))
        per_token = (stamps[-1] - stamps[0]) * 1e3 / max(n - 1, 1)
        return (stamps[0] - t0) * 1e3, per_token, usage.prompt_tokens if usage else -1

    def image_ttft_ms(image):
        t0 = time.perf_counter()
        runner.send_chat_completion_request(request(args.prompt, image, max_tokens=1))
        return (time.perf_counter() - t0) * 1e3

    def throughput(b):
        """Completion tokens/s of b streamed requests submitted at once.
        Sending returns at once and the engine thread runs them together;
        the Runner is not reentrant (concurrent sends from Python threads
        fail with "Already borrowed"), so one thread drains the streams one
        after the other while the engine fills them all."""
        t0 = time.perf_counter()
        streams = [runner.send_chat_completion_request(
            request("%s (request %d)" % (args.throughput_prompt, i + 1), stream=True))
            for i in range(b)]
        tokens = sum(drain(s)[1] for s in streams)
        return tokens / (time.perf_counter() - t0)

    r = {}
    timed(args.throughput_prompt)
    runs = [timed(args.prompt) for _ in range(args.repeats)]
    r["text_ttft_ms"] = min(t[0] for t in runs)
    r["text_ms_per_token"] = min(t[1] for t in runs)
    r["text_prompt_tokens"] = runs[0][2]
    for b in concurrency:
        r["tps_%d" % b] = max(throughput(b) for _ in range(args.repeats))
    r["cold_ttft_ms"] = image_ttft_ms(args.cold_image)
    with tempfile.TemporaryDirectory() as tmp:
        r["ttft_ms"] = min(image_ttft_ms(image_variant(args.image, i, tmp))
                           for i in range(args.repeats))

    p = "mistralrs_%s_" % args.dtype
    lines = ["mistralrs_version %s" % version("mistralrs"),
             "%sthreads %s" % (p, os.environ.get("RAYON_NUM_THREADS", "all")),
             "%sready_s %.2f" % (p, ready_s)]
    lines += ["%s%s %.2f" % (p, k, v) for k, v in r.items()]
    results.write("\n".join(lines) + "\n")
    results.flush()


if __name__ == "__main__":
    main()
