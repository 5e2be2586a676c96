#!/usr/bin/env bash
# Decode against the memory-bandwidth floor with the probe taken in the same
# run (issue #4's protocol): `tessera probe` read bandwidth, then at once one
# `tessera run` of the assembly (128-token prompt, 64 generated), then the
# probe again (which is also the next repeat's "before"); prints the decode
# rate and its share of the floor (read GB/s over the bytes a token reads) at
# the probe before and at the mean of the sustained rates before and after. This VM's bandwidth moves by a third within minutes,
# so a probe taken minutes before a run says little about that run.
# Usage: tools/bench_floor.sh ASSEMBLY MODEL GB_PER_TOKEN [REPS] [THREADS]
#   e.g. tools/bench_floor.sh assemblies/cpu-fast.yaml /tmp/ckpt/qwen2.5-0.5b 0.99 5
set -u
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,9p "$0"; exit 2; }
ASM=$1 MODEL=$2 GB=$3 REPS=${4:-5} THREADS=${5:-2}
T=build/bin/tessera
# Both of the probe's figures: the median of its passes and the rate sustained
# over a second of passes back to back.
probe() { # probe THREADS -> "median sustained"
  local out
  out=$("$T" probe --threads "$1" --repeats 5 2>/dev/null)
  printf '%s %s\n' "$(printf '%s' "$out" | awk -F: '/"gbs"/ {gsub(/[ ,]/, "", $2); print $2; exit}')" \
    "$(printf '%s' "$out" | awk -F: '/"gbs_sustained"/ {gsub(/[ ,]/, "", $2); print $2; exit}')"
}
# A probe right after each run too: the share against the mean of the two
# sustained rates that bracket the run follows a drift during the run.
read -r gbs sus < <(probe "$THREADS")
for r in $(seq "$REPS"); do
  tok=$("$T" run "$ASM" --model "$MODEL" --threads "$THREADS" --random-prompt 128 -n 64 2>&1 >/dev/null |
        sed -nE 's/.*decode [0-9]+ tokens, ([0-9.]+) tok\/s.*/\1/p')
  read -r gbs2 sus2 < <(probe "$THREADS")
  awk -v g="$gbs" -v s="$sus" -v s2="$sus2" -v t="$tok" -v b="$GB" -v a="$ASM" 'BEGIN {
    m = (s + s2) / 2
    printf "%s: decode %.1f tok/s; probe before: median %.1f GB/s (%.0f%%), sustained %.1f GB/s (%.0f%%); bracketed sustained %.1f GB/s (floor %.1f tok/s, %.0f%%)\n",
      a, t, g, 100 * t * b / g, s, 100 * t * b / s, m, m / b, 100 * t * b / m }'
  gbs=$gbs2 sus=$sus2 # the probe after this run is the probe before the next
done
