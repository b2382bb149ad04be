#!/usr/bin/env python3
"""transformers side of tests/bench/engine_vs_transformers.sh: time
MllamaForConditionalGeneration on CPU for one image request, with the prompt
ids and the pixel tensor our engine used, and print "key value" lines.

    python engine_hf.py --model DIR --pixels PIXELS.npy --layout LAYOUT.json \
        --ids 1,2,3 --max-tokens N --dtype bf16|f32 [--threads 2] [--repeats 3] \
        [--text-ids 1,2,3] [--batch-ids FILE --concurrency "1 4 8 16"]

PIXELS.npy and LAYOUT.json come from `mllama preprocess` (bit-exact with
MllamaImageProcessor). Every figure is the best of --repeats runs after one
warm-up, in milliseconds:

  vision_tower_ms   model.vision_model on the (1, 1, max_tiles, 3, S, S) pixels
  projector_ms      model.multi_modal_projector + the reshape of forward()
  cross_kv_ms       every cross layer's k_proj and v_proj of the projected
                    states: what a resident image state saves per request
  vision_ms         the sum of the three (our vision_ms covers the same work)
  prefill_ms        forward(input_ids, cross_attention_states) over the prompt
                    (num_logits_to_keep=1, as generate() does), minus
                    cross_kv_ms: the text decoder alone
  ttft_ms           forward(input_ids, pixel_values) + argmax: vision and
                    prefill as generate()'s first step runs them
  ms_per_token      greedy decode steps after the first token, image attended
                    (model.forward with the DynamicCache, like generate()
                    minus its logits processors: a lower bound on generate)
  text_ms_per_token the same for the text-only prompt --text-ids, if given
  text_ttft_ms      forward(text ids) + argmax of that prompt
  tps_<B>           with --batch-ids (one comma-separated prompt per line):
                    completion tokens/s of generate() over the first B
                    prompts as one batch, left padded, greedy, --max-tokens
                    new tokens each (min_new_tokens too: end-of-sequence is
                    masked, so every sequence runs to --max-tokens); wall of
                    the call, prefill
                    included; for each B of --concurrency, best of --repeats
                    after one untimed call
  ready_s           process start to the model loaded (imports included);
                    load_s is from_pretrained alone
  gemm_gflops       torch.matmul of (6432, 1280) x (1280, 1280) in the model's
                    dtype (a vision projection over 4 tiles): shows whether
                    bf16 runs on AMX/AVX512-BF16 (oneDNN) or is emulated

The decode loop runs --max-tokens - 1 steps so that its tokens match our
engine's (the first token comes from the prefill). output_ids are the greedy
tokens of the image request.
"""
import argparse
import json
import os
import sys
import time

from peers_report import process_age_s

# A vision q/k/v/o projection over 4 padded tiles of the 11B tower.
GEMM_M, GEMM_K, GEMM_N = 6432, 1280, 1280


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--pixels", required=True)
    p.add_argument("--layout", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--text-ids")
    p.add_argument("--max-tokens", type=int, default=33)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-ids")
    p.add_argument("--concurrency", default="1 4 8 16")
    return p.parse_args()


def best_ms(fn, repeats):
    """Best wall time of fn() over `repeats` runs after one warm-up, and the
    last result."""
    result = fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, result


def main():
    args = parse_args()
    import numpy as np
    import torch
    import transformers
    from transformers import DynamicCache, MllamaForConditionalGeneration
    from transformers.models.mllama.processing_mllama import (
        convert_sparse_cross_attention_mask_to_dense, get_cross_attention_token_mask)

    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    t0 = time.perf_counter()
    model = MllamaForConditionalGeneration.from_pretrained(args.model, torch_dtype=dtype)
    model.eval()
    load_s = time.perf_counter() - t0
    ready_s = process_age_s()
    cfg = model.config

    with open(args.layout) as f:
        layout = json.load(f)
    max_tiles = cfg.vision_config.max_num_tiles
    tiles = np.load(args.pixels)                     # (n_tiles, 3, S, S) f32
    pixels = np.zeros((1, 1, max_tiles) + tiles.shape[1:], dtype=np.float32)
    pixels[0, 0, :tiles.shape[0]] = tiles
    pixel_values = torch.from_numpy(pixels).to(dtype)
    aspect_ratio_ids = torch.tensor([[layout["aspect_ratio_id"]]])
    aspect_ratio_mask = torch.tensor([[layout["aspect_ratio_mask"]]])

    ids = [int(x) for x in args.ids.split(",")]
    input_ids = torch.tensor([ids])
    n_prompt = len(ids)
    token_mask = get_cross_attention_token_mask(ids, cfg.image_token_index)
    cross_mask = torch.from_numpy(convert_sparse_cross_attention_mask_to_dense(
        [token_mask], [[layout["tiles"]]], max_tiles, n_prompt))   # (1, n, 1, max_tiles)
    cross_layers = [model.language_model.model.layers[i].cross_attn
                    for i in cfg.text_config.cross_attention_layers]
    hidden = cfg.text_config.hidden_size

    def vision_tower():
        return model.vision_model(pixel_values=pixel_values, aspect_ratio_ids=aspect_ratio_ids,
                                  aspect_ratio_mask=aspect_ratio_mask)[0]

    def projector(vout):
        return model.multi_modal_projector(vout).reshape(-1, vout.shape[-2], hidden)

    def cross_kv(states):
        return [(a.k_proj(states), a.v_proj(states)) for a in cross_layers]

    def prefill(states, cache):
        return model(input_ids=input_ids, cross_attention_states=states,
                     cross_attention_mask=cross_mask, past_key_values=cache, use_cache=True,
                     cache_position=torch.arange(n_prompt), num_logits_to_keep=1)

    def first_token():
        out = model(input_ids=input_ids, pixel_values=pixel_values,
                    aspect_ratio_ids=aspect_ratio_ids, aspect_ratio_mask=aspect_ratio_mask,
                    cross_attention_mask=cross_mask, past_key_values=DynamicCache(),
                    use_cache=True, cache_position=torch.arange(n_prompt), num_logits_to_keep=1)
        return int(out.logits[0, -1].argmax())

    def decode(prompt, mask, states, steps):
        """Prefill then `steps` greedy steps; returns (ms per step, ids)."""
        cache = DynamicCache()
        n = prompt.shape[1]
        out = model(input_ids=prompt, cross_attention_states=states, cross_attention_mask=mask,
                    past_key_values=cache, use_cache=True, cache_position=torch.arange(n),
                    num_logits_to_keep=1)
        out_ids = [int(out.logits[0, -1].argmax())]
        t0 = time.perf_counter()
        for step in range(steps):
            # generate() extends the mask by repeating its last row.
            if mask is not None:
                mask = torch.cat([mask, mask[:, -1:]], dim=1)
            out = model(input_ids=torch.tensor([[out_ids[-1]]]), cross_attention_mask=mask,
                        past_key_values=cache, use_cache=True,
                        cache_position=torch.tensor([n + step]))
            out_ids.append(int(out.logits[0, -1].argmax()))
        return (time.perf_counter() - t0) * 1e3 / max(steps, 1), out_ids

    pad = model.generation_config.pad_token_id
    pad = 0 if pad is None else pad  # masked out: any id will do

    def throughput(prompts):
        """Completion tokens/s of one generate() over the prompts, left padded."""
        width = max(len(q) for q in prompts)
        ids = torch.tensor([[pad] * (width - len(q)) + q for q in prompts])
        mask = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in prompts])
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                             pad_token_id=pad)
        return (out.shape[1] - width) * len(prompts) / (time.perf_counter() - t0)

    r = {}
    with torch.inference_mode():
        a = torch.randn(GEMM_M, GEMM_K).to(dtype)
        b = torch.randn(GEMM_K, GEMM_N).to(dtype)
        gemm_ms, _ = best_ms(lambda: torch.matmul(a, b), args.repeats)
        gemm_gflops = 2.0 * GEMM_M * GEMM_K * GEMM_N / gemm_ms / 1e6
        r["vision_tower_ms"], vout = best_ms(vision_tower, args.repeats)
        r["projector_ms"], states = best_ms(lambda: projector(vout), args.repeats)
        r["cross_kv_ms"], _ = best_ms(lambda: cross_kv(states), args.repeats)
        r["vision_ms"] = r["vision_tower_ms"] + r["projector_ms"] + r["cross_kv_ms"]
        full_prefill_ms, _ = best_ms(lambda: prefill(states, DynamicCache()), args.repeats)
        r["prefill_ms"] = full_prefill_ms - r["cross_kv_ms"]
        r["ttft_ms"], _ = best_ms(first_token, args.repeats)
        steps = args.max_tokens - 1
        best, out_ids = float("inf"), []
        for _ in range(args.repeats):
            ms, out_ids = decode(input_ids, cross_mask, states, steps)
            best = min(best, ms)
        r["ms_per_token"] = best
        if args.text_ids:
            text = torch.tensor([[int(x) for x in args.text_ids.split(",")]])
            r["text_ms_per_token"] = min(decode(text, None, None, steps)[0]
                                         for _ in range(args.repeats))
            r["text_ttft_ms"], _ = best_ms(
                lambda: int(model(input_ids=text, num_logits_to_keep=1).logits[0, -1].argmax()),
                args.repeats)
        if args.batch_ids:
            with open(args.batch_ids) as f:
                prompts = [[int(x) for x in line.split(",")] for line in f if line.strip()]
            # The first generate() of a process pays a one-off setup (1.9 against
            # 100+ tokens/s at B=1 in a bf16 smoke run): one untimed call first.
            throughput(prompts[:1])
            for b in (int(x) for x in args.concurrency.split()):
                if b > len(prompts):
                    sys.exit("--concurrency %d: only %d prompts in %s" % (b, len(prompts),
                                                                        args.batch_ids))
                r["tps_%d" % b] = max(throughput(prompts[:b]) for _ in range(args.repeats))

    p = "hf_%s_" % args.dtype
    print("hf_version %s" % transformers.__version__)
    print("torch_version %s" % torch.__version__)
    print("torch_cpu_capability %s" % torch.backends.cpu.get_cpu_capability())
    print("%sthreads %d" % (p, torch.get_num_threads()))
    print("%sload_s %.2f" % (p, load_s))
    print("%sready_s %.2f" % (p, ready_s))
    for k, v in r.items():
        print("%s%s %.2f" % (p, k, v))
    print("%sdecode_tokens_per_s %.2f" % (p, 1e3 / r["ms_per_token"]))
    print("%sgemm_gflops %.1f" % (p, gemm_gflops))
    print("%soutput_ids %s" % (p, ",".join(str(i) for i in out_ids)))
    sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
