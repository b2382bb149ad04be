#!/usr/bin/env python3
"""HF `tokenizers` side of tests/bench/tokenizer.sh: encode TEXT_FILE with
config/tokenizer/tokenizer.json (+ <|image|>) on one thread, whole and line by
line, and print "key value" lines like bench_tokenizer.

    TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 python tokenizer_hf.py REPO TEXT_FILE
"""
import os
import sys
import time

MIN_REPEATS = 3
MIN_SECONDS = 1.0


def best_time(fn):
    best, start, runs, result = float("inf"), time.perf_counter(), 0, None
    while runs < MIN_REPEATS or time.perf_counter() - start < MIN_SECONDS:
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best, result


def main():
    repo, text_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.join(repo, "tests", "golden"))
    import tokenizers
    from tokenizer_refs import load_reference_tokenizer

    t0 = time.perf_counter()
    tok = load_reference_tokenizer(repo)
    load_s = time.perf_counter() - t0
    with open(text_path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()

    whole_s, enc = best_time(lambda: tok.encode(text, add_special_tokens=False))
    loop_s, loop_n = best_time(lambda: sum(len(tok.encode(l, add_special_tokens=False).ids)
                                           for l in lines))
    batch_s, batch = best_time(lambda: tok.encode_batch(lines, add_special_tokens=False))
    batch_n = sum(len(e.ids) for e in batch)
    print("hf_version %s" % tokenizers.__version__)
    print("hf_load_seconds %.4f" % load_s)
    print("hf_whole_tokens %d" % len(enc.ids))
    print("hf_whole_seconds %.5f" % whole_s)
    print("hf_whole_tokens_per_s %.0f" % (len(enc.ids) / whole_s))
    print("hf_lines_tokens %d" % loop_n)
    print("hf_lines_seconds %.5f" % loop_s)
    print("hf_lines_tokens_per_s %.0f" % (loop_n / loop_s))
    print("hf_batch_tokens %d" % batch_n)
    print("hf_batch_seconds %.5f" % batch_s)
    print("hf_batch_tokens_per_s %.0f" % (batch_n / batch_s))


if __name__ == "__main__":
    main()
