#!/usr/bin/env python3
"""Summaries and Markdown tables for the engine benchmarks (tests/bench/*.sh).
Standard library only.

    bench_report.py ours [--median] RUN.jsonl...
        Best-of-runs (or median) timings of `mllama run --batch` outputs
        (RUN.wall next to each RUN.jsonl holds the process wall seconds) as
        "key value" lines: ours_<i>_<timing> for request i, and a wall-clock
        cross-check.
    bench_report.py compare OURS.kv HF.kv... [--model DIR --layout FILE --peak-gflops X
            --peak-name TEXT]
        The engine-vs-transformers table. Ours: request 1 (the image
        transformers gets, a warm miss), request 0 (another image of the
        same size, first in a fresh process), request 2 (text only). With
        --model, --layout (`mllama preprocess`'s, for the image's real tiles)
        and --peak-gflops (the multiply-add peak the vision encode runs on,
        measured in the same run), the encode's FLOP bound against both
        engines' times.
    bench_report.py bandwidth --model DIR --ours OURS.kv --read-gbs X [--kv-bytes 4]
        Decode bytes per step from config.json against the time per token.
    bench_report.py roofline --model DIR --read-gbs X --fma-gflops Y [--dot-gflops Z]
            [--median-read-gbs W] [--kv-bytes 4] [--preset NAME] [--machine TEXT]
            KIND:B=RUN.jsonl[,RUN.jsonl...]...
        Per decode step of B sequences together (KIND text or image): the
        median step time of the runs (each run's median over its steps that
        decoded all B) against the larger of bytes / read bandwidth and
        FLOPs / f32 FMA peak; with --dot-gflops (bf16 activations), the
        Linears' FLOPs / their bf16 peak (AMX's, else the bf16 dot's) plus
        the attention's / f32 FMA peak
        (roofline.sh).
    bench_report.py fp8 --bf16 BF16.kv... --fp8 FP8.kv...
            [--bf16-concurrent B=RUN.jsonl,... --fp8-concurrent B=RUN.jsonl,...]...
        Decode ms/token of an FP8 checkpoint against its bf16 original, per
        request: the median and spread (min-max) of each over the runs and
        of the ratio of each bf16 run to the fp8 run paired with it
        (fp8_decode.sh alternates them, so a pair saw the same neighbours);
        with the concurrent runs, the same of B concurrent requests' ms per
        token and decode step of B rows.
    bench_report.py runtime --cache OURS.kv B=RUN.jsonl[,RUN.jsonl...]...
        Throughput against concurrency (the fastest run of each B), and
        image-cache miss against hit.
    bench_report.py revisions --base-rev REV --base-seq BASE.kv... --tree-seq TREE.kv...
            [--base-concurrent B=RUN.jsonl,... --tree-concurrent B=RUN.jsonl,...]...
        This tree's timings over a base revision's (compare_revisions.sh): each
        timing's median and spread (min-max) over the runs, and the same of
        the ratio of the runs paired by the script's alternation.
"""
import argparse
import json
import os
import sys

TIMINGS = ("vision_ms", "prefill_ms", "ttft_ms", "decode_ms", "ms_per_token")


def read_runs(path):
    """Per-request results and the aggregate of one `mllama run --batch` output."""
    reqs, agg = [], None
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "aggregate" in o:
                agg = o["aggregate"]
            else:
                reqs.append(o)
    return reqs, agg


def decode_step(agg, seqs):
    """The aggregate's entry for the decode steps of `seqs` rows (count,
    median, min, max ms), or None where no step decoded that many."""
    steps = [d for d in (agg or {}).get("decode_steps", []) if d["seqs"] == seqs]
    return steps[0] if steps else None


def paired_concurrent(cmd, a_specs, b_specs):
    """[(B, a's aggregates, b's aggregates)] of two sides' B=RUN.jsonl,...
    options, the runs of each B paired in order (the script alternated
    them); each side must name the same B with as many runs."""
    a = dict(s.split("=", 1) for s in a_specs or [])
    b = dict(s.split("=", 1) for s in b_specs or [])
    if set(a) != set(b):
        sys.exit("%s: both sides need runs of the same concurrency" % cmd)
    out = []
    for n in a:
        aggs = [[read_runs(p)[1] for p in side[n].split(",")] for side in (a, b)]
        if len(aggs[0]) != len(aggs[1]):
            sys.exit("%s: %s concurrent: the runs are paired" % (cmd, n))
        out.append((int(n), aggs[0], aggs[1]))
    return out


def paired_row(label, timing, a, b, speedup=False, digits=2):
    """A table row of two sides' timings over paired runs: each one's median
    (min-max), and the same of b / a per pair (a / b with speedup: b's
    speedup over a); dashes where a run lacks the timing."""
    if None in a or None in b:
        return [label, timing, "–", "–", "–"]
    ratios = [x / y if speedup else y / x for x, y in zip(a, b)]
    return [label, timing, spread(a, digits), spread(b, digits), spread(ratios, unit="x")]


def concurrent_timings(agg, seqs):
    """ms per completion token (1 / tokens/s, prefill included) and the
    median decode step of `seqs` rows, ms, of one concurrent run."""
    step = decode_step(agg, seqs) or {}
    return 1e3 / agg["completion_tokens_per_s"], step.get("median_ms")


def read_kv(paths):
    kv = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                parts = line.split(None, 1)
                if len(parts) == 2:
                    kv[parts[0]] = parts[1].strip()
    return kv


def num(kv, key):
    v = kv.get(key)
    return float(v) if v not in (None, "") else None


def fmt(v, digits=1):
    return "–" if v is None else "%.*f" % (digits, v)


def ratio(hf, ours):
    return "–" if hf is None or not ours else "%.2fx" % (hf / ours)


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# ---- ours ---------------------------------------------------------------------


def median(vs):
    vs = sorted(vs)
    n = len(vs)
    return vs[n // 2] if n % 2 else (vs[n // 2 - 1] + vs[n // 2]) / 2


def cmd_ours(args):
    best, first = {}, None
    every = {}
    walls = []
    for path in args.runs:
        reqs, agg = read_runs(path)
        first = first or reqs
        wall_path = os.path.splitext(path)[0] + ".wall"
        proc = float(open(wall_path).read()) if os.path.exists(wall_path) else None
        served = sum(r["timings"]["ttft_ms"] + r["timings"]["decode_ms"] for r in reqs) / 1e3
        walls.append((proc, agg["wall_s"] if agg else None, served))
        for r in reqs:
            for k in TIMINGS:
                key = "ours_%d_%s" % (r["index"], k)
                best[key] = min(best.get(key, float("inf")), r["timings"][k])
                every.setdefault(key, []).append(r["timings"][k])
    if args.median:
        best = {key: median(vs) for key, vs in every.items()}
    for key, v in best.items():
        print("%s %.2f" % (key, v))
    for r in first:
        i = r["index"]
        print("ours_%d_prompt_ids %s" % (i, ",".join(map(str, r["prompt_ids"]))))
        print("ours_%d_output_ids %s" % (i, ",".join(map(str, r["output_ids"]))))
        print("ours_%d_completion_tokens %d" % (i, r["usage"]["completion_tokens"]))
        print("ours_%d_images_cached %d" % (i, r["usage"]["images_cached"]))
    # Wall-clock cross-check of the fastest run: process = load + batch;
    # batch = the requests' own time + image decode/preprocess between them.
    proc, batch, served = min(walls, key=lambda w: w[2])
    print("ours_runs %d" % len(args.runs))
    if proc is not None:
        print("ours_wall_process_s %.3f" % proc)
    if batch is not None:
        print("ours_wall_batch_s %.3f" % batch)
    print("ours_wall_requests_s %.3f" % served)


# ---- engine vs transformers ---------------------------------------------------------


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# Tokens of a vision tile are padded to a multiple of this (engine/model/vision.c,
# as MllamaVisionModel pads them).
VISION_TOKEN_PAD = 8


def vision_flops(cfg, tiles):
    """FLOPs of one image's encode (what `vision_ms` covers: the vision tower,
    the projector, every cross layer's k_proj and v_proj) with `tiles` real
    tiles, as (ours, every pair): 2 per multiply-add of every product. The
    attention differs: the aspect-ratio mask leaves a real token every key
    and a padding token (a padding tile's, or a tile's pad) the real keys,
    and ours skips blocks of keys no query of a block sees, so its count is
    those pairs (a lower bound: a block with some masked pairs is computed
    whole); transformers' SDPA computes every pair. Norms, GELU and the
    softmax are left out: a few FLOPs an element, not a product."""
    v = cfg["vision_config"]
    D = cfg["text_config"]["hidden_size"]
    _, _, _, _, kv_w, _, n_cross = text_dims(cfg)
    Dv, Iv, T = v["hidden_size"], v["intermediate_size"], v["max_num_tiles"]
    patches = (v["image_size"] // v["patch_size"]) ** 2
    P = patches + 1  # the CLS token
    S = T * (-(-P // VISION_TOKEN_PAD) * VISION_TOKEN_PAD)
    layers = v["num_hidden_layers"] + v["num_global_layers"]
    real, tokens = tiles * P, cross_slots(cfg)  # T * P tokens leave the tower
    products = (T * patches * v["num_channels"] * v["patch_size"] ** 2 * Dv  # patch conv
                + layers * S * (4 * Dv * Dv + 2 * Dv * Iv)  # q, k, v, o; fc1, fc2
                + tokens * v["vision_output_dim"] * D  # projector
                + n_cross * 2 * tokens * D * kv_w)  # cross k_proj, v_proj

    def with_attention(pairs):  # q.k and p.v over heads x head_dim = Dv
        return 2 * (products + layers * 2 * pairs * Dv)

    return with_attention(real * S + (S - real) * real), with_attention(S * S)


def vision_bound(args, ours, hf, dtypes):
    """Lines on the encode's FLOP bound (vision_flops at --peak-gflops)."""
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    with open(args.layout) as f:
        tiles = json.load(f)["tiles"]
    ours_flops, all_flops = vision_flops(cfg, tiles)
    ours_ms, all_ms = (f / args.peak_gflops / 1e6 for f in (ours_flops, all_flops))
    lines = ["vision encode against the %s (%.1f GFLOP/s, measured in this run), %d-tile image:"
             % (args.peak_name, args.peak_gflops, tiles),
             "  ours: %.1f GFLOP (the pairs the mask leaves), bound %.0f ms = %.0f%% of its %s ms"
             % (ours_flops / 1e9, ours_ms, 100 * ours_ms / num(ours, "ours_1_vision_ms"),
                fmt(num(ours, "ours_1_vision_ms")))]
    for d in dtypes:
        t = num(hf, "hf_%s_vision_ms" % d)
        lines.append("  transformers %s: %.1f GFLOP (every pair), bound %.0f ms = %.0f%% of its "
                     "%s ms; %gx its speed takes ours at %.0f%% of our bound"
                     % (d, all_flops / 1e9, all_ms, 100 * all_ms / t, fmt(t), args.vision_goal,
                        100 * ours_ms / (t / args.vision_goal)))
    return lines


def cmd_compare(args):
    ours = read_kv([args.ours])
    hf = read_kv(args.hf)
    dtypes = [d for d in ("bf16", "f32") if "hf_%s_vision_ms" % d in hf]
    n_prompt = len(ours["ours_1_prompt_ids"].split(","))
    n_text = len(ours["ours_2_prompt_ids"].split(","))
    n_out = int(ours["ours_1_completion_tokens"])

    rows_spec = [
        ("vision encode, ms (tower + projector + cross K/V)", "ours_1_vision_ms", "vision_ms"),
        ("text prefill, %d tokens, ms" % n_prompt, "ours_1_prefill_ms", "prefill_ms"),
        ("TTFT (vision + prefill + 1st token), ms", "ours_1_ttft_ms", "ttft_ms"),
        ("decode with the image, ms/token", "ours_1_ms_per_token", "ms_per_token"),
        ("decode, text only (%d-token prompt), ms/token" % n_text, "ours_2_ms_per_token",
         "text_ms_per_token"),
    ]
    header = ["metric", "ours"] + ["transformers %s" % d for d in dtypes] + \
             ["speedup vs %s" % d for d in dtypes]
    rows = []
    for label, ok, hk in rows_spec:
        o = num(ours, ok)
        hv = [num(hf, "hf_%s_%s" % (d, hk)) for d in dtypes]
        rows.append([label, fmt(o)] + [fmt(v) for v in hv] + [ratio(v, o) for v in hv])
        if hk == "ms_per_token":
            tps = [1e3 / v if v else None for v in hv]
            o_tps = 1e3 / o if o else None
            rows.append(["decode with the image, tokens/s", fmt(o_tps, 2)] +
                        [fmt(v, 2) for v in tps] + [ratio(o_tps, v) for v in tps])
    for label, hk in (("transformers: vision_model, ms", "vision_tower_ms"),
                      ("transformers: multi_modal_projector, ms", "projector_ms"),
                      ("transformers: cross k_proj + v_proj, ms", "cross_kv_ms")):
        rows.append([label, ""] + [fmt(num(hf, "hf_%s_%s" % (d, hk))) for d in dtypes] +
                    ["" for _ in dtypes])
    rows.append(["first request in a fresh process: vision / prefill, ms",
                 "%s / %s" % (fmt(num(ours, "ours_0_vision_ms")),
                              fmt(num(ours, "ours_0_prefill_ms")))] +
                ["" for _ in dtypes] * 2)
    rows.append(["torch GEMM 6432x1280x1280, GFLOP/s", ""] +
                [fmt(num(hf, "hf_%s_gemm_gflops" % d)) for d in dtypes] + ["" for _ in dtypes])
    print(md_table(header, rows))
    print()
    if args.model:
        print("\n".join(vision_bound(args, ours, hf, dtypes)))
        print()

    ours_ids = [int(x) for x in ours["ours_1_output_ids"].split(",")]
    for d in dtypes:
        ids = [int(x) for x in hf["hf_%s_output_ids" % d].split(",")]
        print("greedy tokens equal to ours (image request): transformers %s %d of %d"
              % (d, common_prefix(ours_ids, ids), min(len(ids), len(ours_ids))))
    print("ours: %d generated tokens per request (ms/token excludes the first); best of %s runs"
          % (n_out, ours.get("ours_runs", "?")))
    if "ours_wall_process_s" in ours:
        print("ours: wall check: process %.2f s = load %.2f s + batch %.2f s; the requests' "
              "own ttft + decode add up to %.2f s of the batch (the rest: JPEG decode and "
              "preprocessing before each submit)"
              % (num(ours, "ours_wall_process_s"),
                 num(ours, "ours_wall_process_s") - num(ours, "ours_wall_batch_s"),
                 num(ours, "ours_wall_batch_s"), num(ours, "ours_wall_requests_s")))
    for goal, label, ok, hk in ((args.decode_goal, "decode (image)", "ours_1_ms_per_token",
                                 "ms_per_token"),
                                (args.vision_goal, "vision encode", "ours_1_vision_ms",
                                 "vision_ms")):
        parts = []
        for d in dtypes:
            h, o = num(hf, "hf_%s_%s" % (d, hk)), num(ours, ok)
            x = h / o
            parts.append("vs %s %.2fx (%s)" % (d, x, "met" if x >= goal else "NOT met"))
        print("goal %s >= %gx transformers: %s" % (label, goal, ", ".join(parts)))


# ---- decode bandwidth ---------------------------------------------------------------


def text_dims(cfg):
    """(hidden, intermediate, heads, head_dim, K/V width, self layers, cross layers)."""
    t = cfg["text_config"]
    D, I, H = t["hidden_size"], t["intermediate_size"], t["num_attention_heads"]
    hd = t.get("head_dim") or D // H
    n_cross = len(set(t["cross_attention_layers"]))
    return D, I, H, hd, t["num_key_value_heads"] * hd, t["num_hidden_layers"] - n_cross, n_cross


def decode_weights(cfg, image):
    """What one decode step reads of the weights whatever the batch: (Linear
    weight elements, their output rows, other bf16 weight elements, lm_head
    elements; the last are in the third too)."""
    t = cfg["text_config"]
    D, I, H, hd, kv_w, n_self, n_cross = text_dims(cfg)
    mlp = 3 * D * I
    # (Linear weights, their output rows, other bf16 weights) of each layer kind.
    self_layer = (D * H * hd + 2 * D * kv_w + H * hd * D + mlp,
                  H * hd + 2 * kv_w + D + 2 * I + D, 2 * D)
    # k_proj/v_proj ran once at encode; a step reads q, o, the norms, the MLP.
    cross_layer = (D * H * hd + H * hd * D + mlp, H * hd + D + 2 * I + D, 2 * hd + 2 * D)
    layers = [(n_self, self_layer)] + ([(n_cross, cross_layer)] if image else [])
    linear = sum(n * k[0] for n, k in layers)
    rows = sum(n * k[1] for n, k in layers)
    other = sum(n * k[2] for n, k in layers)
    lm_head = t["vocab_size"] * D
    other += lm_head + 2 * D  # lm_head, final norm, one embedding row
    return linear, rows, other, lm_head


def cross_slots(cfg, tiles=None):
    """Key positions of one image's cross K/V: every tile slot's, or those of
    its first `tiles` tiles."""
    v = cfg["vision_config"]
    return (tiles or v["max_num_tiles"]) * ((v["image_size"] // v["patch_size"]) ** 2 + 1)


def decode_kv_bytes(cfg, ctx, kv_bytes, tiles=None):
    """K/V bytes a decode step reads: (one sequence's self-attention cache at
    context ctx, one image's cross K/V over every cross layer). A decode row
    sees its image's real tiles only, and both backends' cross attention
    skips the keys no row of a block sees: with `tiles` (the image's real
    tiles) those tiles' K/V, else every slot's."""
    _, _, _, _, kv_w, n_self, n_cross = text_dims(cfg)
    return (n_self * 2 * ctx * kv_w * kv_bytes,
            n_cross * 2 * cross_slots(cfg, tiles) * kv_w * kv_bytes)


def mean_context(n_prompt, n_tokens):
    """The mean context of the decode steps of an n_tokens generation."""
    return n_prompt + n_tokens / 2.0


def decode_bytes(cfg, n_prompt, n_tokens, image, kv_bytes, fp8_lm_head=False, tiles=None):
    """Bytes one greedy decode step of one sequence reads: (weights, K/V),
    averaged over the steps of an n_tokens generation after an n_prompt
    prompt. With a quantization_config (an FP8 checkpoint: mkmodel --fp8's
    ignores lm_head, the projector and the vision tower) the text decoder's
    Linears read one byte a weight and a float32 scale a row; fp8_lm_head
    (model.fp8_lm_head) makes lm_head so too. tiles: decode_kv_bytes'."""
    linear, rows, other, lm_head = decode_weights(cfg, image)
    fp8 = "quantization_config" in cfg
    weights = (linear + 4 * rows if fp8 else 2 * linear) + 2 * other
    if fp8_lm_head:
        weights += lm_head + 4 * cfg["text_config"]["vocab_size"] - 2 * lm_head
    kv_self, kv_cross = decode_kv_bytes(cfg, mean_context(n_prompt, n_tokens), kv_bytes, tiles)
    return weights, kv_self + (kv_cross if image else 0)


def cmd_bandwidth(args):
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    ours = read_kv([args.ours])
    rows = []
    summary = []
    for label, i, image in (("text only", 0, False), ("with 1 image", 1, True)):
        ms = num(ours, "ours_%d_ms_per_token" % i)
        n_prompt = len(ours["ours_%d_prompt_ids" % i].split(","))
        n_tok = int(ours["ours_%d_completion_tokens" % i])
        w, kv = decode_bytes(cfg, n_prompt, n_tok, image, args.kv_bytes, args.fp8_lm_head,
                             args.image_tiles)
        gbs = (w + kv) / ms / 1e6
        rows.append([label, "%.1f" % (w / 1e6), "%.1f" % (kv / 1e6), "%.2f" % ms, "%.2f" % (1e3 / ms),
                     "%.1f" % gbs, "%.0f%%" % (100 * gbs / args.read_gbs)])
        summary.append((label, gbs / args.read_gbs))
    header = ["decode step", "weights MB", "K/V MB", "ms/token", "tokens/s", "GB/s",
              "of read BW %.1f GB/s" % args.read_gbs]
    print(md_table(header, rows))
    print()
    for label, frac in summary:
        print("goal >= %d%% of read bandwidth, %s: %.0f%% (%s)"
              % (args.goal, label, 100 * frac, "met" if 100 * frac >= args.goal else "NOT met"))


def spread(vs, digits=2, unit=""):
    return "%.*f%s (%.*f-%.*f)" % (digits, median(vs), unit, digits, min(vs), digits, max(vs))


def cmd_fp8(args):
    if len(args.bf16) != len(args.fp8):
        sys.exit("fp8: as many bf16 runs as fp8 runs (they are paired)")
    base, fp8 = [read_kv([p]) for p in args.bf16], [read_kv([p]) for p in args.fp8]
    rows, verdicts = [], []
    for label, i in (("text only", 0), ("with 1 image", 1)):
        key = "ours_%d_ms_per_token" % i
        a, b = [num(kv, key) for kv in base], [num(kv, key) for kv in fp8]
        ratios = [x / y for x, y in zip(a, b)]
        same = base[0]["ours_%d_output_ids" % i] == fp8[0]["ours_%d_output_ids" % i]
        rows.append([label, spread(a), spread(b), spread(ratios, unit="x"),
                     "same" if same else "differ"])
        verdicts.append("%s %s" % (label, "met" if median(ratios) >= args.goal else "NOT met"))
    print("%d paired runs; median (min-max)" % len(base))
    print(md_table(["decode", "bf16 ms/token", "fp8 ms/token", "speedup", "greedy tokens"],
                   rows))
    print()
    print("goal >= %.1fx (median): %s" % (args.goal, ", ".join(verdicts)))
    print()
    # The stages FP8 should leave as they were (the vision tower stays bf16;
    # prefill runs the FP8 GEMM regime).
    stages = []
    for label, i, timing in (("prefill, text only", 0, "prefill_ms"),
                             ("prefill, with 1 image", 1, "prefill_ms"),
                             ("vision, 1 image", 1, "vision_ms")):
        key = "ours_%d_%s" % (i, timing)
        a, b = [num(kv, key) for kv in base], [num(kv, key) for kv in fp8]
        stages.append([label, spread(a), spread(b),
                       spread([x / y for x, y in zip(a, b)], unit="x")])
    print(md_table(["stage", "bf16 ms", "fp8 ms", "speedup"], stages))
    conc = []
    for b, bagg, fagg in paired_concurrent("fp8", args.bf16_concurrent, args.fp8_concurrent):
        bt = [concurrent_timings(a, b) for a in bagg]
        ft = [concurrent_timings(a, b) for a in fagg]
        for timing, i in (("ms per completion token", 0), ("decode step of %d rows, ms" % b, 1)):
            conc.append(paired_row("%d concurrent" % b, timing, [t[i] for t in bt],
                                   [t[i] for t in ft], speedup=True))
    if conc:
        print()
        print(md_table(["requests", "timing", "bf16", "fp8", "speedup"], conc))


# ---- roofline -----------------------------------------------------------------------


def decode_flops(cfg, ctx, image, tiles=None):
    """FLOPs of one sequence's decode step at context ctx, as (Linears,
    attention): 2 per weight of every Linear and lm_head (a multiply-add,
    f32 FMA whatever the weights' dtype, or bf16 products with bf16
    activations), and the attention's two products (q.k and p.v, 2 FLOPs a
    multiply-add, f32 FMA in either mode) over the self-attention cache and,
    with an image, its keys in every cross layer (tiles: decode_kv_bytes').
    Norms, RoPE, softmax and the activation functions are left out: a few
    FLOPs per element of the activations, not per weight."""
    linear, _, _, lm_head = decode_weights(cfg, image)
    _, _, H, hd, _, n_self, n_cross = text_dims(cfg)
    keys = n_self * ctx + (n_cross * cross_slots(cfg, tiles) if image else 0)
    return 2 * (linear + lm_head), 2 * 2 * H * hd * keys


def roofline_run(path, b):
    """One `mllama run --batch` of b requests, after as many warm-up ones or
    not (make_batch.py --warm-up; the aggregate leaves them out): (the
    measured requests' prompt length, tokens each, median ms of their steps
    that decoded all b, their count, vision encodes in the run, the fastest
    of those steps, the GB/s at which the process read its own weights after
    them: `mllama run --weights-read`, None without it)."""
    reqs, agg = read_runs(path)
    encodes = sum(r["usage"]["images"] - r["usage"]["images_cached"] for r in reqs)
    reqs = [r for r in reqs if not r.get("warm_up")]
    if len(reqs) != b:
        sys.exit("roofline: %s holds %d requests, expected %d" % (path, len(reqs), b))
    lengths = {len(r["prompt_ids"]) for r in reqs}
    if len(lengths) != 1:
        sys.exit("roofline: %s: prompt lengths %s differ, so the requests do not decode in "
                 "lockstep (make_batch.py --same-length)" % (path, sorted(lengths)))
    step = decode_step(agg, b)
    if not step:
        sys.exit("roofline: %s: no step decoded all %d sequences together (a request ended "
                 "at its first token, or the mllama build predates decode_steps)" % (path, b))
    own = (agg.get("weights_read") or {}).get("gb_per_s") or None
    return (lengths.pop(), max(r["usage"]["completion_tokens"] for r in reqs),
            step["median_ms"], step["steps"], encodes, step["min_ms"], own)


def cmd_roofline(args):
    cfg = json.load(open(os.path.join(args.model, "config.json")))
    rows, missed, missed_best, missed_med, missed_own, n = [], [], [], [], [], 0
    own_cols, n_own = [], 0
    for spec in args.runs:
        kind, rest = spec.split(":", 1)
        b, paths = rest.split("=", 1)
        if kind not in ("text", "image"):
            sys.exit("roofline: %s: expected text:B=... or image:B=..." % spec)
        b, image = int(b), kind == "image"
        runs = [roofline_run(p, b) for p in paths.split(",")]
        n_prompt, n_tokens = runs[0][0], runs[0][1]
        ms = [r[2] for r in runs]
        ctx = mean_context(n_prompt, n_tokens)
        weights, _ = decode_bytes(cfg, n_prompt, n_tokens, image, args.kv_bytes)
        kv_self, kv_cross = decode_kv_bytes(cfg, ctx, args.kv_bytes, args.image_tiles)
        # The weights and the image's cross K/V are the same for every
        # sequence: read once a step from memory whatever b.
        nbytes = weights + b * kv_self + (kv_cross if image else 0)
        linear_flops, attn_flops = (b * f for f in decode_flops(cfg, ctx, image,
                                                                 args.image_tiles))
        flops = linear_flops + attn_flops
        mem_ms = nbytes / args.read_gbs / 1e6
        if args.dot_gflops:
            # The bf16 Linears on their bf16 products (AMX, or the dot on
            # the FMA ports), the attention on f32 FMAs: one after the other
            # in a step, so their times add.
            fma_ms = (linear_flops / args.dot_gflops + attn_flops / args.fma_gflops) / 1e6
        else:
            fma_ms = flops / args.fma_gflops / 1e6
        bound = max(mem_ms, fma_ms)
        frac = bound / median(ms)
        # On a shared VM the highest bandwidth sample can be one lucky
        # minute: the same bound at the median sample says where the step
        # stands against what the machine usually lends.
        frac_med = None
        if args.median_read_gbs:
            frac_med = max(nbytes / args.median_read_gbs / 1e6, fma_ms) / median(ms)
            if 100 * frac_med < args.goal:
                missed_med.append("%s B=%d" % (kind, b))
        # Each process against the rate at which it read its own weights
        # (its pages, its minute): the bound of that process's memory.
        own = [r[6] for r in runs]
        frac_own = None
        if all(own):
            frac_own = median([max(nbytes / g / 1e6, fma_ms) / r[2] for r, g in zip(runs, own)])
            n_own += 1
            if 100 * frac_own < args.goal:
                missed_own.append("%s B=%d" % (kind, b))
        own_cols.append(["-", "-"] if frac_own is None
                        else ["%.0f%%" % (100 * frac_own), spread(own, digits=1)])
        # The machine's bounds are the highest of their samples, taken when
        # the machine was least disturbed; a step's best is its time then.
        best = min(r[5] for r in runs)
        frac_best = bound / best
        n += 1
        if 100 * frac < args.goal:
            missed.append("%s B=%d" % (kind, b))
        if 100 * frac_best < args.goal:
            missed_best.append("%s B=%d" % (kind, b))
        rows.append([args.preset, "1 image" if image else "none", "%d" % b, "%.0f" % ctx,
                     "%d" % min(r[3] for r in runs), spread(ms), "%.1f" % (nbytes / 1e6),
                     "%.3f" % (flops / 1e9), "%.2f" % mem_ms, "%.2f" % fma_ms,
                     "%.2f (%s)" % (bound, "memory" if mem_ms >= fma_ms else "compute"),
                     "%.0f%%" % (100 * frac), "%.2f" % best, "%.0f%%" % (100 * frac_best)]
                    + ([] if frac_med is None else ["%.0f%%" % (100 * frac_med)]))
        if image and any(r[4] != 1 for r in runs):
            print("note: %s B=%d: vision encodes per run %s, expected 1 (the same image for "
                  "all)" % (kind, b, [r[4] for r in runs]))
    print(md_table(["preset", "images", "B", "mean context", "steps",
                    "ms/step, median (min-max)", "MB/step", "GFLOP/step", "memory bound ms",
                    "compute bound ms", "larger bound ms", "bound / measured",
                    "best step ms", "bound / best step"]
                   + (["bound at the median bandwidth / measured"] if args.median_read_gbs
                      else [])
                   + (["bound at the process's own read / measured", "own read GB/s"]
                      if n_own else []),
                   [r + c for r, c in zip(rows, own_cols)] if n_own else rows))
    print()
    peaks = "f32 FMA peak %.1f GFLOP/s" % args.fma_gflops
    if args.dot_gflops:
        peaks += " (attention), bf16 peak %.1f GFLOP/s (bf16 Linears)" % args.dot_gflops
    print("read bandwidth %.1f GB/s%s, %s; K/V %d bytes an element"
          % (args.read_gbs, "" if not args.median_read_gbs
             else " (median sample %.1f)" % args.median_read_gbs, peaks, args.kv_bytes))
    if args.machine:
        print("machine: %s" % args.machine)
    print("goal >= %d%% of the larger bound: met at %d of %d%s"
          % (args.goal, n - len(missed), n,
             "" if not missed else "; NOT met at " + ", ".join(missed)))
    print("the same against each row's best step: met at %d of %d%s"
          % (n - len(missed_best), n,
             "" if not missed_best else "; NOT met at " + ", ".join(missed_best)))
    if args.median_read_gbs:
        print("the same with the median bandwidth sample's memory bound: met at %d of %d%s"
              % (n - len(missed_med), n,
                 "" if not missed_med else "; NOT met at " + ", ".join(missed_med)))
    if n_own:
        print("the same with each process's read of its own weights as its memory bound "
              "(the median of the processes' fractions): met at %d of %d%s"
              % (n_own - len(missed_own), n_own,
                 "" if not missed_own else "; NOT met at " + ", ".join(missed_own)))


# ---- runtime ------------------------------------------------------------------------


def cmd_runtime(args):
    rows, base = [], None
    for spec in args.runs:
        b, paths = spec.split("=", 1)
        # The fastest of the runs of this batch size.
        reqs, agg = max((read_runs(p) for p in paths.split(",")),
                        key=lambda run: run[1]["completion_tokens_per_s"])
        tps = agg["completion_tokens_per_s"]
        base = base or tps
        ttft = sum(r["timings"]["ttft_ms"] for r in reqs) / len(reqs)
        mpt = sum(r["timings"]["ms_per_token"] for r in reqs) / len(reqs)
        rows.append([b, "%d" % agg["completion_tokens"], "%.2f" % agg["wall_s"], "%.1f" % tps,
                     "%.2fx" % (tps / base), "%.0f" % ttft, "%.1f" % mpt])
    print(md_table(["concurrent requests", "completion tokens", "wall s", "tokens/s",
                    "vs 1", "mean TTFT ms", "mean ms/token"], rows))
    print()
    ours = read_kv([args.cache])
    crow = []
    for label, i in (("miss, first request in the process", 0), ("miss (warm)", 1),
                     ("hit (same image as the warm miss)", 2)):
        crow.append([label, fmt(num(ours, "ours_%d_vision_ms" % i)),
                     fmt(num(ours, "ours_%d_prefill_ms" % i)),
                     fmt(num(ours, "ours_%d_ttft_ms" % i)),
                     ours.get("ours_%d_images_cached" % i, "?")])
    print(md_table(["image request", "vision ms", "prefill ms", "TTFT ms", "images cached"],
                   crow))
    print()
    miss, hit = num(ours, "ours_1_ttft_ms"), num(ours, "ours_2_ttft_ms")
    cut = 100 * (1 - hit / miss)
    print("cache hit cuts TTFT by %.1f%% against a warm miss (goal >= %d%%: %s); "
          "%.1f%% against the first request" % (cut, args.goal, "met" if cut >= args.goal else
                                                 "NOT met",
                                                 100 * (1 - hit / num(ours, "ours_0_ttft_ms"))))


# ---- revisions --------------------------------------------------------------


def cmd_revisions(args):
    """Each timing over the repeats, this tree's and the base's, and the
    ratio of the runs paired by the script's alternation (the same minute
    of the host), median (min-max): a host whose speed moves from minute to
    minute moves both runs of a pair."""
    if len(args.base_seq) != len(args.tree_seq):
        sys.exit("revisions: as many base runs as tree runs (they are paired)")
    base = [read_kv([p]) for p in args.base_seq]
    tree = [read_kv([p]) for p in args.tree_seq]
    rows = []

    def row(label, timing, b, t):
        rows.append(paired_row(label, timing, b, t))

    for label, i in (("text only", 0), ("image", 1)):
        for k in TIMINGS:
            if k == "decode_ms" or (i == 0 and k == "vision_ms"):
                continue
            key = "ours_%d_%s" % (i, k)
            row(label, k, [num(kv, key) for kv in base], [num(kv, key) for kv in tree])
    for b, bagg, tagg in paired_concurrent("revisions", args.base_concurrent,
                                           args.tree_concurrent):
        bt = [concurrent_timings(a, b) for a in bagg]
        tt = [concurrent_timings(a, b) for a in tagg]
        row("%d concurrent" % b, "ms per completion token", [x[0] for x in bt],
            [x[0] for x in tt])
        row("%d concurrent" % b, "decode step of %d rows, ms" % b, [x[1] for x in bt],
            [x[1] for x in tt])
    print("%d paired runs; median (min-max)" % len(base))
    print(md_table(["request", "timing", "base %s" % args.base_rev, "this tree",
                    "this tree / base"], rows))


IMAGE_TILES_HELP = ("the image's real tiles (mllama preprocess's layout), whose cross K/V a "
                    "decode step reads; default every tile slot")


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("ours")
    o.add_argument("--median", action="store_true")
    o.add_argument("runs", nargs="+")
    c = sub.add_parser("compare")
    c.add_argument("ours")
    c.add_argument("hf", nargs="+")
    c.add_argument("--decode-goal", type=float, default=5)
    c.add_argument("--vision-goal", type=float, default=2)
    c.add_argument("--model", help="with --layout and --peak-gflops: the vision FLOP bound")
    c.add_argument("--layout", help="mllama preprocess's layout of the compared image")
    c.add_argument("--peak-gflops", type=float, help="the peak the vision encode runs on")
    c.add_argument("--peak-name", default="f32 FMA peak")
    b = sub.add_parser("bandwidth")
    b.add_argument("--model", required=True)
    b.add_argument("--ours", required=True)
    b.add_argument("--read-gbs", type=float, required=True)
    b.add_argument("--kv-bytes", type=int, default=4)
    b.add_argument("--goal", type=int, default=60)
    b.add_argument("--fp8-lm-head", action="store_true",
                   help="lm_head read as FP8 (model.fp8_lm_head), whatever the checkpoint holds")
    b.add_argument("--image-tiles", type=int, help=IMAGE_TILES_HELP)
    rl = sub.add_parser("roofline")
    rl.add_argument("--model", required=True)
    rl.add_argument("--read-gbs", type=float, required=True)
    rl.add_argument("--fma-gflops", type=float, required=True)
    rl.add_argument("--dot-gflops", type=float,
                    help="the bf16 products' peak (AMX, else the bf16 dot): the bf16 "
                    "Linears' compute bound (bf16 activations)")
    rl.add_argument("--kv-bytes", type=int, default=4)
    rl.add_argument("--median-read-gbs", type=float,
                    help="the median bandwidth sample: a further column and goal line")
    rl.add_argument("--goal", type=int, default=85)
    rl.add_argument("--image-tiles", type=int, help=IMAGE_TILES_HELP)
    rl.add_argument("--preset", default="?")
    rl.add_argument("--machine", help="the CPU, ISA, threads and load, printed with the table")
    rl.add_argument("runs", nargs="+", metavar="KIND:B=RUN.jsonl[,RUN.jsonl...]")
    f = sub.add_parser("fp8")
    f.add_argument("--bf16", required=True, nargs="+")
    f.add_argument("--fp8", required=True, nargs="+")
    f.add_argument("--goal", type=float, default=1.8)
    f.add_argument("--bf16-concurrent", action="append")
    f.add_argument("--fp8-concurrent", action="append")
    r = sub.add_parser("runtime")
    r.add_argument("--cache", required=True)
    r.add_argument("--goal", type=int, default=80)
    r.add_argument("runs", nargs="+", metavar="B=RUN.jsonl[,RUN.jsonl...]")
    v = sub.add_parser("revisions")
    v.add_argument("--base-rev", required=True)
    v.add_argument("--base-seq", required=True, nargs="+")
    v.add_argument("--tree-seq", required=True, nargs="+")
    v.add_argument("--base-concurrent", action="append")
    v.add_argument("--tree-concurrent", action="append")
    args = p.parse_args()
    if args.cmd == "compare" and args.model and not (args.layout and args.peak_gflops):
        p.error("compare --model needs --layout and --peak-gflops")
    {"revisions": cmd_revisions, "ours": cmd_ours, "compare": cmd_compare, "bandwidth": cmd_bandwidth,
     "fp8": cmd_fp8, "runtime": cmd_runtime, "roofline": cmd_roofline}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
