#!/usr/bin/env bash
# Decode against the memory-bandwidth floor with the probe taken in the same
# run (issue #4's protocol): each repeat measures `tessera probe` read
# bandwidth, then at once one `tessera run` of the assembly (128-token
# prompt, 64 generated), and prints the decode rate, the floor at that probe
# (read GB/s over the bytes a token reads) and the share. This VM's bandwidth moves by a third within minutes,
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
for r in $(seq "$REPS"); do
  probe=$("$T" probe --threads "$THREADS" --repeats 5 2>/dev/null)
  gbs=$(printf '%s' "$probe" | awk -F: '/"gbs"/ {gsub(/[ ,]/, "", $2); print $2; exit}')
  sus=$(printf '%s' "$probe" | awk -F: '/"gbs_sustained"/ {gsub(/[ ,]/, "", $2); print $2; exit}')
  tok=$("$T" run "$ASM" --model "$MODEL" --threads "$THREADS" --random-prompt 128 -n 64 2>&1 >/dev/null |
        sed -nE 's/.*decode [0-9]+ tokens, ([0-9.]+) tok\/s.*/\1/p')
  awk -v g="$gbs" -v s="$sus" -v t="$tok" -v b="$GB" -v a="$ASM" 'BEGIN {
    printf "%s: decode %.1f tok/s; probe median %.1f GB/s (floor %.1f tok/s, %.0f%%), sustained %.1f GB/s (floor %.1f tok/s, %.0f%%)\n",
      a, t, g, g / b, 100 * t * b / g, s, s / b, 100 * t * b / s }'
done
