#!/usr/bin/env python3
"""kv_quality.py - measure the quality bound of cpu_kv_cache (and of any
assembly) against the reference assembly: mean KL(ref || test) of the
next-token distributions and the perplexity ratio test/ref on a fixed token
sequence, through `tessera score`.

  kv_quality.py [--limit N] [--check MAX_KL MAX_PPL] TESSERA_BIN MODEL TOKENS WORKDIR ASSEMBLY...

TOKENS: a .json file (pystd eval.json: its prompts concatenated) or ids
"1,2,3"; --limit keeps the first N. Prints one line per assembly; with
--check, exits 1 if an assembly's mean KL or perplexity ratio is above the
bound. Needs numpy. Exit 77 (skip) when the model is missing.
"""
import argparse, json, os, struct, subprocess, sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed")
    sys.exit(77)


def read_logits(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        base = 8 + n
        t = hdr["logits"]
        assert t["dtype"] == "F32"
        a, b = t["data_offsets"]
        f.seek(base + a)
        return np.frombuffer(f.read(b - a), dtype=np.float32).reshape(t["shape"]).astype(np.float64)


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--check", type=float, nargs=2, metavar=("MAX_KL", "MAX_PPL"))
    ap.add_argument("exe")
    ap.add_argument("model")
    ap.add_argument("toks")
    ap.add_argument("work")
    ap.add_argument("asms", nargs="+")
    o = ap.parse_args()
    exe, model, toks, work, asms = o.exe, o.model, o.toks, o.work, o.asms
    if not os.path.exists(model) or not os.path.exists(exe):
        print(f"SKIP: {model} or {exe} missing")
        sys.exit(77)
    if toks.endswith(".json"):
        ids = [i for p in json.load(open(toks))["prompts"] for i in p]
    else:
        ids = [int(x) for x in toks.split(",")]
    if o.limit:
        ids = ids[:o.limit]
    os.makedirs(work, exist_ok=True)
    tf = os.path.join(work, "tokens.txt")
    open(tf, "w").write(",".join(map(str, ids)))
    outs = {}
    for a in ["assemblies/cpu-reference.yaml"] + asms:
        out = os.path.join(work, os.path.basename(a) + ".safetensors")
        subprocess.run([exe, "score", a, "--model", model, "--tokens", "@" + tf, "--out", out,
                        "--threads", "2"], check=True, stderr=subprocess.DEVNULL)
        outs[a] = log_softmax(read_logits(out))
    ref = outs["assemblies/cpu-reference.yaml"]
    nxt = np.array(ids[1:])
    nll_ref = -ref[np.arange(len(nxt)), nxt].mean()
    print(f"{len(ids)} tokens, reference ppl {np.exp(nll_ref):.4f}")
    bad = 0
    for a in asms:
        lp = outs[a]
        kl = (np.exp(ref) * (ref - lp)).sum(axis=1)
        nll = -lp[np.arange(len(nxt)), nxt].mean()
        ratio = np.exp(nll - nll_ref)
        print(f"{a}: mean KL {kl.mean():.3e} (max {kl.max():.3e}), ppl ratio {ratio:.6f}, "
              f"argmax agreement {np.mean(lp.argmax(1) == ref.argmax(1)):.4f}")
        if o.check and (not kl.mean() <= o.check[0] or not ratio <= o.check[1]):
            print(f"FAIL: {a} above the bound: mean KL <= {o.check[0]}, ppl ratio <= {o.check[1]}")
            bad = 1
        if o.check and kl.mean() == 0 and "int8" in a:
            print(f"FAIL: {a}: zero KL for a lossy KV cache means nothing was compared")
            bad = 1
    sys.exit(bad)


if __name__ == "__main__":
    main()
