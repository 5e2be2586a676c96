#!/usr/bin/env bash
# CPU benchmarks for BENCHMARKS.md: each line is one run of `tessera run`
# (prompt tok/s, decode tok/s, load time) with its peak resident memory.
# Usage: tools/bench_cpu.sh [REPS]   (checkpoints in $CKPT, default /tmp/ckpt)
set -u
cd "$(dirname "$0")/.."
REPS=${1:-3}
CKPT=${CKPT:-/tmp/ckpt}
T=build/bin/tessera
one() { # label, args...
  local label=$1; shift
  for r in $(seq "$REPS"); do
    /usr/bin/time -f "rss_kb=%M" "$T" run "$@" 2>&1 >/dev/null | tr '\n' ' ' |
      sed -E "s/^/$label: /; s/ +/ /g"; echo
  done
}
build/bin/tessera probe --repeats 5 2>/dev/null | grep -E '"gbs"|"gflops"'
one "stories260K ref 1t" --threads 1 -p "Once upon a time" -n 120 --ignore-eos
one "stories260K fast 1t" assemblies/cpu-fast-gemv.yaml --threads 1 -p "Once upon a time" -n 120 --ignore-eos
one "stories260K cpu-fast 1t" assemblies/cpu-fast.yaml --threads 1 -p "Once upon a time" -n 120 --ignore-eos
for shape in qwen2.5-0.5b llama3.2-1b; do
  [ -d "$CKPT/$shape" ] || /usr/bin/python3 ../shared/tools/mk_random_checkpoint.py "$shape" "$CKPT/$shape" >/dev/null
  one "$shape ref 2t (16+4)" --model "$CKPT/$shape" --threads 2 --random-prompt 16 -n 4
  one "$shape cpu-fast-gemv 2t (128+64)" assemblies/cpu-fast-gemv.yaml --model "$CKPT/$shape" --threads 2 --random-prompt 128 -n 64
  one "$shape cpu-fast-gemv-int8 2t (128+64)" assemblies/cpu-fast-gemv-int8.yaml --model "$CKPT/$shape" --threads 2 --random-prompt 128 -n 64
  one "$shape cpu-fast 2t (128+64)" assemblies/cpu-fast.yaml --model "$CKPT/$shape" --threads 2 --random-prompt 128 -n 64
  one "$shape cpu-fast-int8 2t (128+64)" assemblies/cpu-fast-int8.yaml --model "$CKPT/$shape" --threads 2 --random-prompt 128 -n 64
done
