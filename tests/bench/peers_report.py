#!/usr/bin/env python3
"""Helpers and tables of tests/bench/peers.sh (our engine side by side with
transformers and mistral.rs). Standard library only; the tables reuse
bench_report.py's.

    peers_report.py exec OUT.rusage CMD...
        Runs CMD and writes its peak RSS, wall and CPU seconds and how many of
        its threads did the work ("key value" lines) to OUT.rusage; exits with
        CMD's status.
    peers_report.py ids RUN.jsonl
        The prompt ids of each request of a `mllama run --batch` output, one
        comma-separated line per request in index order (transformers gets
        our prompt ids for its batched throughput).
    peers_report.py table --machine MACHINE.kv --ours OURS.kv --ours-rusage R
            --ours-concurrent B=RUN.jsonl,... [--peer NAME=PEER.kv,PEER.rusage]...
            [--decode-goal 2] [--vision-goal 2] [--json OUT]
        One Markdown table per metric: each engine's figure and ours/peer;
        --json also writes the figures for `rounds`.
    peers_report.py rounds ROUND.json... [--decode-goal 2] [--vision-goal 2]
        The rounds of peers.sh --rounds: per metric, ours' advantage over each
        peer in every round and its median; the goals held to the medians.

process_age_s() is imported by the peer scripts: their load time runs from
the process start, as ours (process wall minus batch wall) does.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from statistics import median

from bench_report import md_table, num, read_kv, read_runs

# How often exec samples the child's threads' CPU times (a run shorter than
# this has no thread figures).
SAMPLE_S = 0.2
# A thread counts as one that did the work when it used at least this
# fraction of the busiest thread's CPU time (pool threads that only idle and
# the main thread waiting on them fall below).
BUSY_FRACTION = 0.25


def process_age_s():
    """Seconds since this process started (/proc, clock-tick resolution)."""
    with open("/proc/self/stat") as f:
        # Fields after the command name (which may hold spaces); starttime is
        # field 22 of the whole line.
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def thread_name(pid, tid):
    try:
        with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
            return f.read().strip().replace(" ", "_")
    except OSError:
        return "?"


def thread_cpu_ticks(pid):
    """{(tid, name): utime + stime in clock ticks} of pid's threads now."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = thread_name(pid, tid)
        out[(tid, name)] = int(fields[11]) + int(fields[12])
    return out


def cmd_exec(args):
    t0 = time.perf_counter()
    child = subprocess.Popen(args.cmd)
    ticks = {}
    done = threading.Event()

    def sample():
        while not done.wait(SAMPLE_S):
            ticks.update(thread_cpu_ticks(child.pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    rc = child.wait()
    done.set()
    sampler.join()
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    top = max(ticks.values(), default=0)
    busy = sorted(name for (_, name), t in ticks.items() if top and t >= BUSY_FRACTION * top)
    with open(args.out, "w") as f:
        f.write("peak_rss_mib %.1f\n" % (ru.ru_maxrss / 1024.0))
        f.write("wall_s %.2f\n" % wall)
        f.write("cpu_s %.2f\n" % (ru.ru_utime + ru.ru_stime))
        f.write("threads_seen %d\n" % len(ticks))
        f.write("busy_threads %d\n" % len(busy))
        # Their names (comm): which pool each belongs to.
        f.write("busy_thread_names %s\n" % ",".join(busy))
    return rc


def cmd_ids(args):
    reqs, _ = read_runs(args.run)
    for r in sorted(reqs, key=lambda r: r["index"]):
        print(",".join(map(str, r["prompt_ids"])))


def peer_figures(kv, prefix, rusage):
    """A peer's numeric figures without their prefix (engine_hf.py's keys
    hf_<dtype>_*, peers_mistralrs.py's mistralrs_<dtype>_*)."""
    f = {}
    for k, v in kv.items():
        if k.startswith(prefix):
            try:
                f[k[len(prefix):]] = float(v)
            except ValueError:  # output_ids and the like
                pass
    f["peak_rss_mib"] = num(rusage, "peak_rss_mib")
    f["busy_threads"] = num(rusage, "busy_threads") if num(rusage, "threads_seen") else None
    f["busy_names"] = rusage.get("busy_thread_names", "")
    return f


def ours_figures(kv, rusage, concurrent):
    proc, batch = num(kv, "ours_wall_process_s"), num(kv, "ours_wall_batch_s")
    f = {"ready_s": proc - batch if proc is not None and batch is not None else None,
         "cold_ttft_ms": num(kv, "ours_0_ttft_ms"),
         "ttft_ms": num(kv, "ours_1_ttft_ms"), "ms_per_token": num(kv, "ours_1_ms_per_token"),
         "text_ttft_ms": num(kv, "ours_2_ttft_ms"),
         "text_ms_per_token": num(kv, "ours_2_ms_per_token"),
         "text_prompt_tokens": len(kv["ours_2_prompt_ids"].split(",")),
         "peak_rss_mib": max(num(r, "peak_rss_mib") for r in rusage),
         "busy_threads": None, "busy_names": ""}
    # The process of ours with the most threads at work; runs shorter than a
    # sample have none.
    sampled = [r for r in rusage if num(r, "threads_seen")]
    if sampled:
        top = max(sampled, key=lambda r: num(r, "busy_threads"))
        f["busy_threads"] = num(top, "busy_threads")
        f["busy_names"] = top.get("busy_thread_names", "")
    for spec in concurrent:
        b, paths = spec.split("=", 1)
        best = max((read_runs(p)[1] for p in paths.split(",")),
                   key=lambda agg: agg["completion_tokens_per_s"])
        f["tps_%s" % b] = best["completion_tokens_per_s"]
        # Ours has no ignore-EOS: how many tokens its batch really generated.
        f["tokens_%s" % b] = best["completion_tokens"]
    return f


# (table title, figure, digits, True when higher is better)
METRICS = [
    ("load time (process start to ready), s", "ready_s", 2, False),
    ("TTFT with the image, ms (warm: the second image request of the process)", "ttft_ms", 0,
     False),
    ("TTFT with an image, first request of the process, ms", "cold_ttft_ms", 0, False),
    ("TTFT text only, ms", "text_ttft_ms", 1, False),
    ("decode with the image, ms/token", "ms_per_token", 1, False),
    ("decode text only, ms/token", "text_ms_per_token", 1, False),
    ("peak RSS, MiB (the whole process: every phase of this run)", "peak_rss_mib", 0, False),
]


def metric_tables(ours):
    """(title, figure, digits, higher is better) of every table: METRICS and
    the throughput at each concurrency ours ran."""
    tps_keys = sorted((k for k in ours if k.startswith("tps_")), key=lambda k: int(k[4:]))
    return list(METRICS) + [
        ("throughput, %s concurrent text requests, completion tokens/s (ours generated %d "
         "tokens; every engine ignores EOS)" % (k[4:], ours["tokens_" + k[4:]]), k, 1, True)
        for k in tps_keys]


def advantage(o, p, higher_better):
    """Ours' advantage over a peer's figure (x), or None without both."""
    if not o or not p:
        return None
    return o / p if higher_better else p / o


def family_best(peers):
    """Each peer family's (hf, mistralrs) faster dtype, figure by figure: the
    goals hold against it."""
    best = {}
    for n, f in peers:
        family = best.setdefault(n.split("-")[0], {})
        for k, v in f.items():
            if isinstance(v, float):
                faster = max if k.startswith("tps_") else min
                family[k] = faster(family.get(k, v), v)
    return best


def goal_lines(family, tps, vision, args, how=""):
    """The goals against a family's faster dtype, from ours' advantages over
    it: tps, the decode throughput's at every concurrency; vision, TTFT with
    the image's (None: not measured). how says what the figures are."""
    lines = []
    tps = [x for x in tps if x is not None]
    if tps:
        lines.append("goal decode throughput >= %gx %s (its faster dtype) at every concurrency%s: "
                     "%s (worst %.2fx)" % (args.decode_goal, family, how,
                                           "met" if min(tps) >= args.decode_goal else "NOT met",
                                           min(tps)))
    if vision is not None:
        lines.append("goal vision (TTFT with the image) >= %gx %s (its faster dtype)%s: %s (%.2fx)"
                     % (args.vision_goal, family, how,
                        "met" if vision >= args.vision_goal else "NOT met", vision))
    return lines


def tps_keys_of(ours):
    return [k for k in ours if k.startswith("tps_")]


def show(v, digits):
    return "–" if v is None else "%.*f" % (digits, v)


def show_x(x):
    return "–" if x is None else "%.2fx" % x


def cmd_table(args):
    machine = read_kv([args.machine])
    ours = ours_figures(read_kv([args.ours]), [read_kv([p]) for p in args.ours_rusage],
                        args.ours_concurrent)
    peers = []
    for spec in args.peer or []:
        name, files = spec.split("=", 1)
        kv_path, rusage_path = files.split(",")
        prefix = name.replace("-", "_") + "_"
        peers.append((name, peer_figures(read_kv([kv_path]), prefix, read_kv([rusage_path]))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "ours": ours, "peers": peers}, f)

    print("machine: %s; ISA: %s; %s threads per engine; ours with %s activations, %s K/V cache" %
          (machine.get("cpu_model", "?"), machine.get("isa", "?"), machine.get("threads", "?"),
           machine.get("ours_activations", "f32"), machine.get("ours_kv_cache", "f32")))
    # transformers runs our prompt ids; mistralrs renders the same template
    # itself, so its length must agree with ours.
    print("text-only prompt tokens: ours %d%s" % (ours["text_prompt_tokens"], "".join(
        ", %s %d" % (n, f["text_prompt_tokens"]) for n, f in peers if "text_prompt_tokens" in f)))
    print()
    header = ["engine", "figure", "ours' advantage (x)"]
    for title, key, digits, higher in metric_tables(ours):
        rows = [["ours", show(ours.get(key), digits), ""]]
        rows += [[n, show(f.get(key), digits), show_x(advantage(ours.get(key), f.get(key), higher))]
                 for n, f in peers]
        print("**%s**" % title)
        print()
        print(md_table(header, rows))
        print()
    print(md_table(["engine", "threads that did the work (of %s asked)" % machine.get("threads",
                                                                                         "?"),
                    "their names"],
                   [["ours", show(ours["busy_threads"], 0), ours["busy_names"]]] +
                   [[n, show(f["busy_threads"], 0), f["busy_names"]] for n, f in peers]))
    print()
    for fam, f in family_best(peers).items():
        tps = [advantage(ours[k], f.get(k), True) for k in tps_keys_of(ours)]
        for line in goal_lines(fam, tps, advantage(ours.get("ttft_ms"), f.get("ttft_ms"), False),
                               args):
            print(line)


def cmd_rounds(args):
    rounds = []
    for path in args.rounds:
        with open(path) as f:
            rounds.append(json.load(f))
    machine = rounds[0]["machine"]
    print("machine: %s; ISA: %s; %s threads per engine; ours with %s activations, %s K/V cache; "
          "%d rounds, ours then each peer in every round" % (
              machine.get("cpu_model", "?"), machine.get("isa", "?"), machine.get("threads", "?"),
              machine.get("ours_activations", "f32"), machine.get("ours_kv_cache", "f32"),
              len(rounds)))
    print()
    names = [n for n, _ in rounds[0]["peers"]]
    header = (["engine", "figure, median"] + ["round %d" % (i + 1) for i in range(len(rounds))] +
              ["ours' advantage, median"])
    for title, key, digits, higher in metric_tables(rounds[0]["ours"]):
        ours_v = [r["ours"].get(key) for r in rounds]
        rows = [["ours", show(median_of(ours_v), digits)] + [show(v, digits) for v in ours_v] +
                [""]]
        for name in names:
            figs = [dict(r["peers"])[name].get(key) for r in rounds]
            xs = [advantage(o, p, higher) for o, p in zip(ours_v, figs)]
            rows.append([name, show(median_of(figs), digits)] + [show_x(x) for x in xs] +
                        [show_x(median_of(xs))])
        print("**%s** (the rounds' columns: ours' figure, then its advantage over each peer)"
              % title)
        print()
        print(md_table(header, rows))
        print()
    # The goals on the median of each round's advantage over the family's
    # faster dtype: the same ours against the same round's peer.
    best = [family_best(r["peers"]) for r in rounds]
    for fam in best[0]:
        tps = [median_of([advantage(r["ours"].get(k), b[fam].get(k), True)
                          for r, b in zip(rounds, best)]) for k in tps_keys_of(rounds[0]["ours"])]
        vision = median_of([advantage(r["ours"].get("ttft_ms"), b[fam].get("ttft_ms"), False)
                            for r, b in zip(rounds, best)])
        for line in goal_lines(fam, tps, vision, args, ", median of the rounds"):
            print(line)


def median_of(values):
    """The median of the values present, or None."""
    present = [v for v in values if v is not None]
    return median(present) if present else None


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="sub", required=True)
    e = sub.add_parser("exec")
    e.add_argument("out")
    e.add_argument("cmd", nargs=argparse.REMAINDER)
    i = sub.add_parser("ids")
    i.add_argument("run")
    t = sub.add_parser("table")
    t.add_argument("--machine", required=True)
    t.add_argument("--ours", required=True)
    t.add_argument("--ours-rusage", required=True, nargs="+")
    t.add_argument("--ours-concurrent", required=True, action="append",
                   metavar="B=RUN.jsonl[,RUN.jsonl...]")
    t.add_argument("--peer", action="append", metavar="NAME=PEER.kv,PEER.rusage")
    t.add_argument("--json", metavar="OUT")
    r = sub.add_parser("rounds")
    r.add_argument("rounds", nargs="+", metavar="ROUND.json")
    for q in (t, r):
        q.add_argument("--decode-goal", type=float, default=2)
        q.add_argument("--vision-goal", type=float, default=2)
    args = p.parse_args()
    commands = {"exec": cmd_exec, "ids": cmd_ids, "table": cmd_table, "rounds": cmd_rounds}
    return commands[args.sub](args)


if __name__ == "__main__":
    sys.exit(main())
