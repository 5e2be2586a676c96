#!/usr/bin/env python3
"""fixtures_check.py - cpu_attention (and cpu_kv_cache f16) on the transformers
fixtures (tests/data/fixtures/transformers): `tessera score` over each
fixture's input_ids with an assembly that differs from the reference only in
those plugins; the logits must stay within TOL of transformers' and the
argmax must agree at every position.

  fixtures_check.py TESSERA_BIN ASSEMBLY TOL [ASSEMBLY TOL]...

Exit 0 when all pass, 1 otherwise, 77 (skip) without numpy or the binary.
"""
import json, os, struct, subprocess, sys, tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed")
    sys.exit(77)


def tensor(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        t = json.loads(f.read(n))[name]
        a, b = t["data_offsets"]
        f.seek(8 + n + a)
        dt = {"F32": np.float32, "I32": np.int32}[t["dtype"]]
        return np.frombuffer(f.read(b - a), dtype=dt).reshape(t["shape"])


def main():
    exe = sys.argv[1]
    pairs = list(zip(sys.argv[2::2], map(float, sys.argv[3::2])))
    if not os.path.exists(exe):
        print(f"SKIP: {exe} missing")
        sys.exit(77)
    bad = 0
    root = "tests/data/fixtures/transformers"
    with tempfile.TemporaryDirectory() as tmp:
        for fam in sorted(os.listdir(root)):
            d = os.path.join(root, fam)
            if not os.path.exists(os.path.join(d, "reference.safetensors")):
                continue
            ref_path = os.path.join(d, "reference.safetensors")
            ids, ref = tensor(ref_path, "input_ids"), tensor(ref_path, "logits")
            tf = os.path.join(tmp, "ids.txt")
            open(tf, "w").write(",".join(map(str, ids)))
            for asm, tol in pairs:
                out = os.path.join(tmp, "out.safetensors")
                r = subprocess.run([exe, "score", asm, "--model", d, "--tokens", "@" + tf, "--out", out,
                                    "--threads", "2"], capture_output=True, text=True)
                if r.returncode:
                    print(f"FAIL {fam} {asm}: {r.stderr.strip()[-300:]}")
                    bad = 1
                    continue
                lg = tensor(out, "logits")
                err = float(np.abs(lg - ref).max())
                agree = float(np.mean(lg.argmax(1) == ref.argmax(1)))
                ok = err <= tol and agree == 1.0
                print(f"{'ok  ' if ok else 'FAIL'} {fam:10s} {asm}: max |logit - transformers| {err:.2e} "
                      f"(tol {tol:g}), argmax agreement {agree:.3f}")
                bad |= not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
