#!/usr/bin/env python3
"""The grammar benchmark's steps (run.sh runs them in order):

    grammar_bench.py inputs CORPUS OUT
        the corpus as `mllama grammar` input lines, one per schema, each
        instance serialized as MaskBench's runner does:
        json.dumps(data, indent=None, ensure_ascii=False).
    grammar_bench.py drive --out RESULTS [--timeout S] INPUTS -- CMD...
        feed INPUTS to CMD (an engine speaking `mllama grammar`'s contract)
        one line at a time; a line that takes over S seconds or kills CMD is
        recorded as not compiled ("timeout ..." / "crashed ...") and CMD is
        started again for the next line.
    grammar_bench.py report CORPUS TOKENIZER_DIR NAME=RESULTS... [--failures FILE]
        the table (markdown) of every engine on the same corpus, the ratios
        of the first engine to the second, and, for the first, its failures
        grouped by reason (written to FILE too).

Scoring. An instance counts as accepted when every token was allowed and the
document was complete after the last one (the contract's `accepted`). A
schema passes when it compiled, every valid instance was accepted and every
invalid one refused. MaskBench's runner is laxer on invalid instances: it
only asks that some token be refused, so an invalid document whose every
token is allowed but which is left incomplete (e.g. a top-level number below
`minimum` that more digits could fix) counts as rejected there; the table
shows those separately.
"""
import argparse
import collections
import gzip
import json
import queue
import re
import subprocess
import sys
import threading
import time


def load_corpus(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def instance_text(data):
    return json.dumps(data, indent=None, ensure_ascii=False)


def cmd_inputs(args):
    with open(args.out, "w", encoding="utf-8") as out:
        for row in load_corpus(args.corpus):
            line = {"schema": row["schema"],
                    "tests": [{"text": instance_text(t["data"])} for t in row["tests"]]}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")


# ---- drive -------------------------------------------------------------------


class Coprocess:
    """CMD with a thread reading its stdout, so a reply can be waited for
    with a timeout."""

    def __init__(self, cmd):
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, encoding="utf-8", errors="replace")
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.q.put(line)
        self.q.put(None)

    def ask(self, line, timeout):
        """The reply line, or None (dead), or raises queue.Empty (timeout)."""
        try:
            self.p.stdin.write(line)
            self.p.stdin.flush()
        except BrokenPipeError:
            return None
        return self.q.get(timeout=timeout)

    def kill(self):
        self.p.kill()
        self.p.wait()

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def cmd_drive(args):
    with open(args.inputs, encoding="utf-8") as f:
        lines = f.readlines()
    proc = None
    t_start = time.monotonic()
    with open(args.out, "w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            if proc is None:
                proc = Coprocess(args.command)
            try:
                reply = proc.ask(line, args.timeout)
            except queue.Empty:
                proc.kill()
                proc = None
                reply = json.dumps({"compiled": False, "error": f"timeout after {args.timeout} s",
                                    "tests": []}) + "\n"
            if reply is None:
                proc.kill()
                reply = json.dumps({"compiled": False, "tests": [],
                                    "error": f"crashed (exit status {proc.p.returncode})"}) + "\n"
                proc = None
            out.write(reply)
            out.flush()
            if (i + 1) % 50 == 0:
                print(f"{args.out}: {i + 1}/{len(lines)} in {time.monotonic() - t_start:.0f} s",
                      file=sys.stderr, flush=True)
    if proc is not None:
        proc.close()


# ---- report ------------------------------------------------------------------


def percentile(values, p):
    """The nearest-rank percentile (MaskBench's: the value at that rank of the
    sorted list)."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def score(corpus, results):
    """Counts and timings of one engine on the corpus."""
    st = collections.Counter()
    compile_us, mask_us = [], []
    for row, res in zip(corpus, results, strict=True):
        st["schemas"] += 1
        if not res.get("compiled"):
            err = res.get("error", "")
            st["timeout" if err.startswith("timeout") else
               "crashed" if err.startswith("crashed") else "refused"] += 1
            continue
        st["compiled"] += 1
        compile_us.append(res["compile_us"])
        ok = True
        for want, got in zip(row["tests"], res["tests"], strict=True):
            mask_us += got["mask_us"]
            st["tokens"] += len(got["mask_us"])
            if want["valid"] and not got["accepted"]:
                st["validation_errors"] += 1
                ok = False
            elif not want["valid"] and got["accepted"]:
                st["invalidation_errors"] += 1
                ok = False
            elif not want["valid"] and "refused_at" not in got:
                st["invalid_only_incomplete"] += 1
        st["passing"] += ok
    return st, compile_us, mask_us


def fmt_int(n):
    return f"{n:,}"


def fmt_us(us):
    """µs below 10 ms, ms above."""
    return f"{us:,.0f} µs" if us < 10000 else f"{us / 1000:,.1f} ms"


def table(names, scored):
    rows = [
        ("schemas", lambda s, c, m: fmt_int(s["schemas"])),
        ("compiled", lambda s, c, m: fmt_int(s["compiled"])),
        ("refused at compile", lambda s, c, m: fmt_int(s["refused"])),
        ("timeout / crashed", lambda s, c, m: f"{s['timeout']} / {s['crashed']}"),
        ("**passing**", lambda s, c, m: f"**{fmt_int(s['passing'])}**"),
        ("validation errors (valid refused)", lambda s, c, m: fmt_int(s["validation_errors"])),
        ("invalidation errors (invalid accepted)",
         lambda s, c, m: fmt_int(s["invalidation_errors"])),
        ("invalid refused only as incomplete", lambda s, c, m: fmt_int(s["invalid_only_incomplete"])),
        ("compile p50", lambda s, c, m: fmt_us(percentile(c, 50))),
        ("compile p99", lambda s, c, m: fmt_us(percentile(c, 99))),
        ("mask p50", lambda s, c, m: fmt_us(percentile(m, 50))),
        ("mask p99", lambda s, c, m: fmt_us(percentile(m, 99))),
        ("mask max", lambda s, c, m: fmt_us(max(m, default=float("nan")))),
        ("tokens walked", lambda s, c, m: fmt_int(s["tokens"])),
    ]
    out = ["| | " + " | ".join(names) + " |", "|:--|" + "--:|" * len(names)]
    for label, f in rows:
        out.append(f"| {label} | " + " | ".join(f(*x) for x in scored) + " |")
    return "\n".join(out)


def common_times(res_a, res_b, name_a, name_b):
    """Compile and mask times on the schemas both engines compile: the
    percentiles over each engine's own compiled set mix in different
    schemas."""
    both = [(a, b) for a, b in zip(res_a, res_b) if a.get("compiled") and b.get("compiled")]
    ca = [a["compile_us"] for a, _ in both]
    cb = [b["compile_us"] for _, b in both]
    ma = [us for a, _ in both for t in a["tests"] for us in t["mask_us"]]
    mb = [us for _, b in both for t in b["tests"] for us in t["mask_us"]]
    parts = []
    for label, x, y in [("compile p50", percentile(ca, 50), percentile(cb, 50)),
                        ("compile p99", percentile(ca, 99), percentile(cb, 99)),
                        ("mask p50", percentile(ma, 50), percentile(mb, 50)),
                        ("mask p99", percentile(ma, 99), percentile(mb, 99)),
                        ("mask max", max(ma, default=0), max(mb, default=0))]:
        parts.append(f"{label} {fmt_us(x)} / {fmt_us(y)}")
    return f"on the {len(both)} schemas both compile, {name_a} / {name_b}: " + "; ".join(parts)


def strata_table(corpus, names, results):
    """Schemas passing per stratum, per engine."""
    strata = sorted({row["stratum"] for row in corpus})
    out = ["| stratum | schemas | " + " | ".join(names) + " |", "|:--|--:|" + "--:|" * len(names)]
    for st in strata:
        idx = [i for i, row in enumerate(corpus) if row["stratum"] == st]
        cells = []
        for res in results:
            cells.append(str(sum(1 for i in idx if passes(corpus[i], res[i]))))
        out.append(f"| {st} | {len(idx)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def passes(row, res):
    return bool(res.get("compiled")) and all(
        want["valid"] == got["accepted"] for want, got in zip(row["tests"], res["tests"]))


def ratios(a, b, name_a, name_b):
    (sa, ca, ma), (sb, cb, mb) = a, b
    parts = [f"passing {sa['passing']}/{sb['passing']} = {sa['passing'] / max(sb['passing'], 1):.2f}"]
    for label, x, y in [("compile p50", percentile(ca, 50), percentile(cb, 50)),
                        ("compile p99", percentile(ca, 99), percentile(cb, 99)),
                        ("mask p50", percentile(ma, 50), percentile(mb, 50)),
                        ("mask p99", percentile(ma, 99), percentile(mb, 99)),
                        ("mask max", max(ma, default=0), max(mb, default=0))]:
        parts.append(f"{label} {x / y:.3g}x" if y else f"{label} -")
    return f"{name_a} / {name_b}: " + "; ".join(parts)


# -- failure reasons -------------------------------------------------------------

ANNOTATIONS = {"title", "description", "examples", "default", "$schema", "$id", "id",
               "$comment", "deprecated", "readOnly", "writeOnly", "markdownDescription"}


def refusal_key(msg):
    """Group compile refusals by their wording: the first line without JSON
    Pointers, numbers and quoted names (the names are listed per group)."""
    m = msg.split("\n")[0]
    m = re.sub(r" at (the root|/.*?)(?=: |$)", "", m)
    m = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", m)
    m = re.sub(r"\d+", "N", m)
    return m[:140]


def quoted_name(msg):
    """The first quoted name of a message (the keyword or format), or ''."""
    found = re.search(r"'([^']*)'|\"([^\"]*)\"", msg)
    return (found.group(1) or found.group(2) or "") if found else ""


def path_at(text, offset):
    """The instance path ([key or index, ...]) of the value being written at
    text[offset], scanning the JSON text up to there."""
    stack = []  # [kind, key-or-index, expecting_key]
    i, n = 0, min(offset, len(text))
    last_string = None
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            last_string = text[i + 1:j]
            if stack and stack[-1][0] == "o" and stack[-1][2]:
                stack[-1][1] = json.loads('"' + last_string + '"') if j < len(text) else last_string
            i = j + 1
            continue
        if c == "{":
            stack.append(["o", None, True])
        elif c == "[":
            stack.append(["a", 0, False])
        elif c in "}]":
            if stack:
                stack.pop()
        elif c == ":":
            if stack:
                stack[-1][2] = False
        elif c == ",":
            if stack and stack[-1][0] == "a":
                stack[-1][1] += 1
            elif stack:
                stack[-1][2] = True
        i += 1
    # A key written but not yet followed by ':' is the object's business,
    # not its value's.
    return [s[1] for s in stack if s[1] is not None and not (s[0] == "o" and s[2])]


def resolve_ref(root, sch):
    seen = 0
    while isinstance(sch, dict) and isinstance(sch.get("$ref"), str) and seen < 32:
        ref = sch["$ref"]
        if not ref.startswith("#"):
            return sch
        node = root
        for part in ref[1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return sch
        sch, seen = node, seen + 1
    return sch


def schema_at(root, path):
    """The subschema for an instance path, following properties, items and
    local $refs; stops at a combinator (what decides there is the combinator)."""
    sch = resolve_ref(root, root)
    for part in path:
        if not isinstance(sch, dict) or any(k in sch for k in ("anyOf", "oneOf", "allOf")):
            break
        if isinstance(part, int):
            pre = sch.get("prefixItems")
            items = sch.get("items")
            if isinstance(pre, list) and part < len(pre):
                sch = pre[part]
            elif isinstance(items, list):
                sch = items[part] if part < len(items) else sch.get("additionalItems", {})
            else:
                sch = items if items is not None else {}
        else:
            props = sch.get("properties") or {}
            if isinstance(props, dict) and part in props:
                sch = props[part]
            else:
                hit = None
                for pat, sub in (sch.get("patternProperties") or {}).items():
                    try:
                        if re.search(pat, part):
                            hit = sub
                            break
                    except re.error:
                        pass
                sch = hit if hit is not None else sch.get("additionalProperties", {})
        sch = resolve_ref(root, sch)
    return sch


def cause_of(sch):
    if not isinstance(sch, dict):
        return f"boolean schema {sch}"
    keys = sorted(k for k in sch if k not in ANNOTATIONS and k not in ("properties",
                                                                        "required", "$defs",
                                                                        "definitions"))
    fmt = f" format={sch['format']}" if isinstance(sch.get("format"), str) else ""
    return ",".join(keys) + fmt if keys else "(no keyword)"


# A mask this slow is worth a look: llguidance's p99 on this corpus is ~0.6 ms.
SLOW_MASK_US = 1000.0


def slow_masks(corpus, results, tok):
    """Masks over SLOW_MASK_US grouped by the subschema's keywords at the
    position they were computed for, with the slowest example of each."""
    groups = collections.defaultdict(list)
    for row, res in zip(corpus, results):
        if not res.get("compiled"):
            continue
        for want, got in zip(row["tests"], res["tests"]):
            slow = [(us, k) for k, us in enumerate(got["mask_us"]) if us >= SLOW_MASK_US]
            if not slow:
                continue
            text = instance_text(want["data"])
            offsets = tok.encode(text, add_special_tokens=False).offsets
            for us, k in slow:
                offset = offsets[k][0] if k < len(offsets) else len(text)
                path = path_at(text, offset)
                cause = cause_of(schema_at(row["schema"], path))
                context = text[max(0, offset - 40):offset] + "⟦" + text[offset:offset + 20] + "⟧"
                groups[cause].append((us, row["id"], "/" + "/".join(map(str, path)), context))
    n = sum(map(len, groups.values()))
    out = [f"## Masks over {SLOW_MASK_US:.0f} µs: {n}, by the subschema's keywords where "
           f"they were computed", ""]
    for cause, hits in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:25]:
        us, sid, path, context = max(hits)
        out.append(f"- {len(hits)} × {cause} (median {percentile([h[0] for h in hits], 50):,.0f} "
                   f"µs); slowest {us:,.0f} µs: {sid} at `{path}` `{context}`")
    return out


def failures(corpus, results, tokenizer_dir, name):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    refusals = collections.defaultdict(list)
    causes = collections.defaultdict(list)
    accepted_invalid = []
    for row, res in zip(corpus, results):
        if not res.get("compiled"):
            refusals[refusal_key(res.get("error", ""))].append((row["id"], res.get("error", "")))
            continue
        for want, got in zip(row["tests"], res["tests"]):
            text = instance_text(want["data"])
            if want["valid"] and not got["accepted"]:
                k = got.get("refused_at")
                if k is None:
                    where, offset, what = "incomplete at the end", len(text), ""
                else:
                    enc = tok.encode(text, add_special_tokens=False)
                    offset = enc.offsets[k][0] if k < len(enc.offsets) else len(text)
                    where = "refused"
                    what = text[max(0, offset - 40):offset] + "⟦" + text[offset:offset + 20] + "⟧"
                path = path_at(text, offset)
                cause = cause_of(schema_at(row["schema"], path))
                causes[f"{where}: {cause}"].append(
                    (row["id"], "/" + "/".join(map(str, path)), what))
            elif not want["valid"] and got["accepted"]:
                accepted_invalid.append((row["id"], text[:160]))

    out = [f"# Failures of {name} on the grammar benchmark corpus", ""]
    out.append(f"## Schemas refused at compile: {sum(map(len, refusals.values()))}, by message")
    out.append("")
    for key, hits in sorted(refusals.items(), key=lambda kv: -len(kv[1])):
        out.append(f"- {len(hits)} × `{key}` — e.g. {hits[0][0]}: `{hits[0][1][:200]}`")
        names = collections.Counter(quoted_name(err) for _, err in hits)
        if len(names) > 1:
            out.append("    - " + ", ".join(f"`{n}` {c}" for n, c in names.most_common(15))
                       + (", ..." if len(names) > 15 else ""))
    out.append("")
    n_val = sum(map(len, causes.values()))
    out.append(f"## Valid instances refused: {n_val}, by the subschema's keywords where it "
               f"happened")
    out.append("")
    for key, hits in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        out.append(f"- {len(hits)} × {key}")
        for sid, path, what in hits[:3]:
            out.append(f"    - {sid} at `{path}` {('`' + what + '`') if what else ''}")
    out.append("")
    out += slow_masks(corpus, results, tok)
    out.append("")
    out.append(f"## Invalid instances accepted: {len(accepted_invalid)}")
    out.append("")
    for sid, text in accepted_invalid[:50]:
        out.append(f"- {sid}: `{text}`")
    return "\n".join(out) + "\n"


def cmd_report(args):
    corpus = load_corpus(args.corpus)
    names, scored, results = [], [], []
    for spec in args.engines:
        name, path = spec.split("=", 1)
        with open(path, encoding="utf-8") as f:
            res = [json.loads(line) for line in f]
        names.append(name)
        results.append(res)
        scored.append(score(corpus, res))
    n_valid = sum(t["valid"] for row in corpus for t in row["tests"])
    n_tests = sum(len(row["tests"]) for row in corpus)
    print(f"{len(corpus)} schemas, {n_tests} instances ({n_valid} valid, "
          f"{n_tests - n_valid} invalid)\n")
    print(table(names, scored))
    print("\nSchemas passing per stratum:\n")
    print(strata_table(corpus, names, results))
    if len(names) >= 2:
        print("\n" + ratios(scored[0], scored[1], names[0], names[1]))
        print(common_times(results[0], results[1], names[0], names[1]))
        mismatch = sum(1 for a, b in zip(results[0], results[1])
                       if a.get("compiled") and b.get("compiled")
                       for x, y in zip(a["tests"], b["tests"]) if x["tokens"] != y["tokens"])
        print(f"instances whose token count differs between {names[0]} and {names[1]}: "
              f"{mismatch}")
    if args.failures:
        text = failures(corpus, results[0], args.tokenizer, names[0])
        with open(args.failures, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"\nfailures of {names[0]}: {args.failures}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("inputs")
    p.add_argument("corpus")
    p.add_argument("out")
    p.set_defaults(run=cmd_inputs)
    p = sub.add_parser("drive")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("inputs")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(run=cmd_drive)
    p = sub.add_parser("report")
    p.add_argument("corpus")
    p.add_argument("tokenizer")
    p.add_argument("engines", nargs="+", metavar="NAME=RESULTS")
    p.add_argument("--failures")
    p.set_defaults(run=cmd_report)
    args = ap.parse_args()
    if args.step == "drive" and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    args.run(args)


if __name__ == "__main__":
    main()
