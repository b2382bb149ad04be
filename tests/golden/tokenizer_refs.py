#!/usr/bin/env python3
"""Reference token ids for tests/engine/test_tokenizer.c, from HF `tokenizers`.

    /opt/refvenv/bin/python tests/golden/tokenizer_refs.py [REPO_ROOT]

Reads tests/golden/tokenizer_corpus.jsonl ({"text": ...} per line) and writes
tests/golden/fixtures/tokenizer/expected.jsonl, one line per corpus line:
    {"ids": [...], "decoded": "..."}
where ids = Tokenizer.encode(text, add_special_tokens=False).ids (special-token
text is parsed as special tokens: HF's default) and decoded =
Tokenizer.decode(ids, skip_special_tokens=False). The tokenizer is
config/tokenizer/tokenizer.json plus <|image|> added as a special token, as
Mllama does; its id must come out as 128256. meta.json records the versions.
"""
import hashlib
import json
import os
import sys

IMAGE_TOKEN = "<|image|>"
IMAGE_ID = 128256


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_reference_tokenizer(repo_root):
    """The HF tokenizer with Mllama's extra special token."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(os.path.join(repo_root, "config", "tokenizer", "tokenizer.json"))
    tok.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    got = tok.token_to_id(IMAGE_TOKEN)
    if got != IMAGE_ID:
        raise RuntimeError("%s got id %r, expected %d" % (IMAGE_TOKEN, got, IMAGE_ID))
    return tok


def generate(repo_root):
    """Write the tokenizer fixtures under repo_root; returns the paths written."""
    import tokenizers

    tok = load_reference_tokenizer(repo_root)
    corpus = os.path.join(repo_root, "tests", "golden", "tokenizer_corpus.jsonl")
    out_dir = os.path.join(repo_root, "tests", "golden", "fixtures", "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    expected = os.path.join(out_dir, "expected.jsonl")
    n = 0
    with open(corpus, encoding="utf-8") as src, open(expected, "w", encoding="utf-8") as dst:
        for line in src:
            text = json.loads(line)["text"]
            ids = tok.encode(text, add_special_tokens=False).ids
            decoded = tok.decode(ids, skip_special_tokens=False)
            dst.write(json.dumps({"ids": ids, "decoded": decoded}, ensure_ascii=False) + "\n")
            n += 1
    meta = os.path.join(out_dir, "meta.json")
    with open(meta, "w", encoding="utf-8") as f:
        json.dump({
            "generator": "tests/golden/tokenizer_refs.py",
            "tokenizers_version": tokenizers.__version__,
            "tokenizer_json_sha256": _sha256(os.path.join(repo_root, "config", "tokenizer",
                                                          "tokenizer.json")),
            "corpus_sha256": _sha256(corpus),
            "lines": n,
            "image_token_id": IMAGE_ID,
            "encode": "Tokenizer.encode(text, add_special_tokens=False)",
            "decode": "Tokenizer.decode(ids, skip_special_tokens=False)",
        }, f, indent=2)
        f.write("\n")
    return [expected, meta]


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for path in generate(root):
        print("wrote", path)
