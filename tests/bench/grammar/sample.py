#!/usr/bin/env python3
"""Draw the benchmark corpus (corpus.jsonl.gz) from MaskBench's data folder.

    python3 sample.py MASKBENCH_DATA_DIR OUT.jsonl.gz [--n 1000] [--seed 22]

MASKBENCH_DATA_DIR is `maskbench/data` of github.com/guidance-ai/jsonschemabench
(one JSON file per schema: {"schema", "tests": [{"valid", "data", ...}], ...}).
Only schemas with at least one instance are drawn (the others cannot pass or
fail). The strata are the files' name prefixes (Github_easy, Kubernetes, BFCL,
...): each gets a share of --n proportional to its size, at least
MIN_PER_STRATUM (or all it has), the remainder going to the largest
fractional shares; within a stratum the files are drawn with
random.Random(seed). Output: one JSON line per schema, sorted by id,
{"id", "stratum", "schema", "tests": [{"valid", "data"}]}, the instances as
MaskBench has them (the runners serialize them as its runner does).
"""
import argparse
import gzip
import json
import os
import random
import sys

# Small strata (a few dozen schemas) would get one or two draws by size
# alone, too few to say anything about them.
MIN_PER_STRATUM = 20


def stratum_of(name):
    """Github_easy---o13947.json -> Github_easy; BFCL_java_0.json -> BFCL."""
    if "---" in name:
        return name.split("---")[0]
    return name.split("_")[0]


def allocate(sizes, n):
    """Per-stratum draws: proportional to sizes, floored at MIN_PER_STRATUM
    (capped by the stratum's size), summing to n (largest remainders)."""
    alloc = {s: min(size, MIN_PER_STRATUM) for s, size in sizes.items()}
    left = n - sum(alloc.values())
    rest = {s: size - alloc[s] for s, size in sizes.items()}
    total = sum(rest.values())
    if left <= 0 or total == 0:
        return alloc
    shares = {s: left * r / total for s, r in rest.items()}
    for s in shares:
        alloc[s] += int(shares[s])
    by_remainder = sorted(shares, key=lambda s: (shares[s] - int(shares[s]), s), reverse=True)
    for s in by_remainder[: n - sum(alloc.values())]:
        alloc[s] += 1
    return alloc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data_dir")
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=22)
    args = ap.parse_args()

    by_stratum = {}
    for name in sorted(os.listdir(args.data_dir)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(args.data_dir, name), encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("tests"):
            by_stratum.setdefault(stratum_of(name), []).append(name)

    rng = random.Random(args.seed)
    alloc = allocate({s: len(v) for s, v in by_stratum.items()}, args.n)
    chosen = []
    for s in sorted(by_stratum):
        chosen += rng.sample(by_stratum[s], alloc[s])

    n_tests = 0
    with gzip.open(args.out, "wt", encoding="utf-8") as out:
        for name in sorted(chosen):
            with open(os.path.join(args.data_dir, name), encoding="utf-8") as f:
                doc = json.load(f)
            tests = [{"valid": t["valid"], "data": t["data"]} for t in doc["tests"]]
            n_tests += len(tests)
            row = {"id": name[: -len(".json")], "stratum": stratum_of(name),
                   "schema": doc["schema"], "tests": tests}
            out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")

    for s in sorted(alloc):
        print(f"{s:16} {alloc[s]:5} of {len(by_stratum[s]):5}", file=sys.stderr)
    print(f"{len(chosen)} schemas, {n_tests} instances", file=sys.stderr)


if __name__ == "__main__":
    main()
