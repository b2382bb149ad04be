#!/usr/bin/env python3
"""`mllama grammar`'s contract spoken by llguidance or xgrammar, so that one
driver and one scorer (grammar_bench.py) treat the three engines alike.

    peers.py --engine llg|xgr --tokenizer DIR < lines > results

Reads JSON lines {"schema": ..., "tests": [{"text": ...}]} and writes one
line per input line: {"compiled", "error", "compile_us", "tests":
[{"accepted", "tokens", "mask_us", "refused_at"}]}. Each text is tokenized
with the Hugging Face tokenizer in DIR without special tokens (MaskBench's
runner: tokenizer.encode(text, add_special_tokens=False)) and walked as
MaskBench does: per token, the mask is computed, the token's bit checked and
the token committed; mask_us times those three together. A text is accepted
when every token was allowed and the grammar is complete after the last one
(llguidance's is_accepting, xgrammar's is_completed).

One thread each: xgrammar's compiler gets max_threads=1 and llguidance runs
its mask on the calling thread (RAYON_NUM_THREADS=1 is set by run.sh for its
compiler). xgrammar runs compile_json_schema with its defaults
(any_whitespace=True, strict_mode=True, any_order=False, no whitespace cap),
llguidance the json_schema grammar with its defaults (whitespace flexible,
additionalProperties as the schema says).
"""
import argparse
import json
import sys
import time

import numpy as np

# Llama 3.2 Vision's logit count: the 128000 BPE tokens and 256 reserved
# specials; <|image|> (128256) has no logit row.
N_VOCAB = 128256


def us_since(t0):
    return (time.perf_counter_ns() - t0) / 1000.0


class Llg:
    name = "llguidance"

    def __init__(self, hf_tok):
        import llguidance
        import llguidance.hf
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        self.llg = llguidance
        self.fill = fill_next_token_bitmask
        self.tok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=N_VOCAB)
        self.mask = allocate_token_bitmask(1, N_VOCAB)
        self.matcher0 = None

    def compile(self, schema):
        grammar = json.dumps({"grammars": [{"json_schema": schema}]})
        m = self.llg.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        self.matcher0 = m

    def start(self):
        self.m = self.matcher0.deep_copy()

    def step(self, t):
        self.fill(self.m, self.mask, 0)
        if not (self.mask[0, t >> 5] >> (t & 31)) & 1:
            return False
        return self.m.consume_token(t)

    def complete(self):
        return self.m.is_accepting()


class Xgr:
    name = "xgrammar"

    def __init__(self, hf_tok):
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(hf_tok, vocab_size=N_VOCAB)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        # numpy through DLPack, as for llguidance: the bit check stays cheap.
        self.mask = np.zeros((1, (N_VOCAB + 31) // 32), dtype=np.int32)
        self.compiled = None

    def compile(self, schema):
        self.compiled = self.compiler.compile_json_schema(json.dumps(schema))

    def start(self):
        self.m = self.xgr.GrammarMatcher(self.compiled)

    def step(self, t):
        self.m.fill_next_token_bitmask(self.mask)
        if not (self.mask[0, t >> 5] >> (t & 31)) & 1:
            return False
        return self.m.accept_token(t)

    def complete(self):
        return self.m.is_completed()


def run_line(engine, hf_tok, line):
    try:
        doc = json.loads(line)
        schema, tests = doc["schema"], doc["tests"]
        texts = [t["text"] for t in tests]
    except (ValueError, KeyError, TypeError) as e:
        return {"compiled": False, "error": f"bad input line: {e!r}", "tests": []}
    t0 = time.perf_counter_ns()
    try:
        engine.compile(schema)
    except Exception as e:  # the engines' refusals come as assorted exceptions
        return {"compiled": False, "error": str(e) or repr(e), "compile_us": round(us_since(t0)),
                "tests": []}
    out = {"compiled": True, "compile_us": round(us_since(t0)), "tests": []}
    for text in texts:
        ids = hf_tok.encode(text, add_special_tokens=False)
        engine.start()
        mask_us, refused_at = [], None
        for i, t in enumerate(ids):
            t0 = time.perf_counter_ns()
            ok = engine.step(t)
            mask_us.append(round(us_since(t0), 1))
            if not ok:
                refused_at = i
                break
        res = {"accepted": refused_at is None and engine.complete(), "tokens": len(ids),
               "mask_us": mask_us}
        if refused_at is not None:
            res["refused_at"] = refused_at
        out["tests"].append(res)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["llg", "xgr"], required=True)
    ap.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(args.tokenizer)
    engine = (Llg if args.engine == "llg" else Xgr)(hf_tok)
    for line in sys.stdin:
        print(json.dumps(run_line(engine, hf_tok, line)), flush=True)


if __name__ == "__main__":
    main()
