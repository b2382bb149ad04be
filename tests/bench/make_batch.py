#!/usr/bin/env python3
"""Write a `mllama run --batch` JSONL file for the engine benchmarks.

    make_batch.py [--max-tokens N] [--prompt TEXT] [--template DIR] [--ignore-eos]
                  --sequence IMAGE|- ...
    make_batch.py [--max-tokens N] [--prompt TEXT] [--template DIR] [--ignore-eos]
                  --concurrent B [--image IMAGE] [--same-length] [--warm-up]

--sequence: one chat request per argument (an image path, or - for text
only), each submitted after the previous one has finished (the batch line's
"after"), so that every request runs alone and its timings are its own.

--concurrent: B chat requests submitted at once (continuous batching), all
with IMAGE or all text only; the prompts differ by a number so that no two
sequences are alike. --same-length writes the numbers with as many digits
as B's (01 .. 16), so that the prompts tokenize to the same length, prefill
together and decode in lockstep (roofline.sh checks the lengths).
--warm-up: first B requests of the same kind marked "warm_up" ("(warm-up
NN)"; with --same-length of the same length, so that they end together),
then the B measured ones, each submitted after the last warm-up request has
finished. The aggregate of `mllama run --batch` leaves the warm-up out, so
the measured steps run on K/V blocks and caches the warm-up used, as a
worker's do once it has served a while (with `mllama run
--no-prefix-cache`, which frees a finished request's blocks for reuse rather
than keeping them cached; the CPU backend faults its pools in at load, so
no step of either pays a page fault).

--template DIR: "prompt" requests instead of "chat" ones, their text rendered
with the chat template of DIR's tokenizer_config.json (transformers'
apply_chat_template), the image token written at the start of the user's
text. That is the prompt mistral.rs builds from the same checkpoint
(peers.sh): our --chat applies the Llama 3.2 Vision Instruct template, which
a checkpoint of `mllama mkmodel` does not carry.

--ignore-eos: every request generates --max-tokens (the batch line's
"ignore_eos", vLLM's): a random-weight checkpoint draws its end tokens now
and then, which would end some sequences of a batch early, and the peers
are run the same way (mistral.rs ignore_eos, transformers min_new_tokens).
"""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max-tokens", type=int, default=33)
    p.add_argument("--prompt", default="Describe this image in detail.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sequence", nargs="+", metavar="IMAGE")
    mode.add_argument("--concurrent", type=int, metavar="B")
    p.add_argument("--image")
    p.add_argument("--template", metavar="DIR")
    p.add_argument("--same-length", action="store_true")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--warm-up", action="store_true")
    args = p.parse_args()

    render = None
    if args.template:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.template)

        def render(text, image):
            content = ("<|image|>" if image else "") + text
            return tok.apply_chat_template([{"role": "user", "content": content}],
                                           tokenize=False, add_generation_prompt=True)

    def request(text, image):
        req = {"chat": text, "max_tokens": args.max_tokens}
        if render:
            req = {"prompt": render(text, image), "max_tokens": args.max_tokens}
        if image:
            req["images"] = [image]
        if args.ignore_eos:
            req["ignore_eos"] = True
        return req

    lines = []
    if args.sequence:
        for i, image in enumerate(args.sequence):
            req = request(args.prompt, image if image != "-" else None)
            if i > 0:
                req["after"] = i - 1
            lines.append(req)
    else:
        width = len(str(args.concurrent)) if args.same_length else 1
        if args.warm_up:
            for i in range(args.concurrent):
                req = request("%s (warm-up %0*d)" % (args.prompt, width, i + 1), args.image)
                req["warm_up"] = True
                lines.append(req)
        last_warm_up = len(lines) - 1
        for i in range(args.concurrent):
            req = request("%s (request %0*d)" % (args.prompt, width, i + 1), args.image)
            if args.warm_up:
                req["after"] = last_warm_up
            lines.append(req)
    for req in lines:
        sys.stdout.write(json.dumps(req) + "\n")


if __name__ == "__main__":
    main()
