#!/usr/bin/env bash
# Decode against the memory-bandwidth floor with the probe taken in the same
# run (issue #4's protocol): `tessera probe` read bandwidth, then at once one
# `tessera run` of the assembly (128-token prompt, 64 generated), then the
# probe again (which is also the next repeat's "before"); prints the decode
# rate and its share of the floor (read GB/s over the bytes a token reads) at
# the probe before and at the mean of the sustained rates before and after,
# and, where the assembly drafts, the tokens a decode pass and the share a
# pass (accepted drafts give more than one token for one read of the
# weights). This VM's bandwidth moves by a third within minutes, so a probe
# taken minutes before a run says little about that run.
# With PREFILL_GFLOP (the FLOPs of one prompt token, in GFLOP) it also prints
# the prompt rate against the probes' f32 multiply-add peak (the ceiling of
# a compute-bound prefill; this VM's moves by 10-20% too).
# Usage: [PREFILL_GFLOP=G] tools/bench_floor.sh ASSEMBLY MODEL GB_PER_TOKEN [REPS] [THREADS]
#   e.g. tools/bench_floor.sh assemblies/cpu-fast.yaml /tmp/ckpt/qwen2.5-0.5b 0.99 5
#        PREFILL_GFLOP=1.946 tools/bench_floor.sh assemblies/cpu-fast.yaml /tmp/ckpt/llama3.2-1b 2.47 5
set -u
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,14p "$0"; exit 2; }
ASM=$1 MODEL=$2 GB=$3 REPS=${4:-5} THREADS=${5:-2} PF=${PREFILL_GFLOP:-}
T=build/bin/tessera
# The probe's figures: the median of its read passes, the rate sustained
# over a second of passes back to back, and the FMA peak.
probe() { # probe THREADS -> "median sustained fma"
  local out
  out=$("$T" probe --threads "$1" --repeats 5 2>/dev/null)
  field() { printf '%s' "$out" | awk -F: -v k="\"$1\"" '$1 ~ k {gsub(/[ ,]/, "", $2); print $2; exit}'; }
  printf '%s %s %s\n' "$(field gbs)" "$(field gbs_sustained)" \
    "$(printf '%s' "$out" | awk -F: '/"fma"/ {f = 1} f && /"gflops"/ {gsub(/[ ,]/, "", $2); print $2; exit}')"
}
# A probe right after each run too: the share against the mean of the two
# sustained rates that bracket the run follows a drift during the run.
read -r gbs sus fma < <(probe "$THREADS")
for r in $(seq "$REPS"); do
  out=$("$T" run "$ASM" --model "$MODEL" --threads "$THREADS" --random-prompt 128 -n 64 2>&1 >/dev/null)
  line=$(printf '%s' "$out" | grep 'decode [0-9]* tokens')
  tok=$(printf '%s' "$line" | sed -nE 's/.*decode [0-9]+ tokens, ([0-9.]+) tok\/s.*/\1/p')
  ptok=$(printf '%s' "$line" | sed -nE 's/.*prompt [0-9]+ tokens, ([0-9.]+) tok\/s.*/\1/p')
  # tokens a decode pass: above 1 when the assembly's drafter had drafts accepted (each
  # pass reads the weights once), so the share per pass is the memory efficiency
  tpp=$(printf '%s' "$out" | sed -nE 's/.*, ([0-9.]+) tokens per decode pass.*/\1/p')
  read -r gbs2 sus2 fma2 < <(probe "$THREADS")
  awk -v g="$gbs" -v s="$sus" -v s2="$sus2" -v t="$tok" -v b="$GB" -v a="$ASM" -v tpp="${tpp:-1}" 'BEGIN {
    m = (s + s2) / 2
    printf "%s: decode %.1f tok/s; probe before: median %.1f GB/s (%.0f%%), sustained %.1f GB/s (%.0f%%); bracketed sustained %.1f GB/s (floor %.1f tok/s, %.0f%%); %.2f tokens a pass: %.0f%% a pass\n",
      a, t, g, 100 * t * b / g, s, 100 * t * b / s, m, m / b, 100 * t * b / m, tpp, 100 * t * b / m / tpp }'
  [ -n "$PF" ] && awk -v p="$ptok" -v f="$PF" -v f1="$fma" -v f2="$fma2" 'BEGIN {
    m = (f1 + f2) / 2
    printf "  prompt %.1f tok/s = %.1f GFLOP/s; FMA peak before %.1f, after %.1f GFLOP/s: %.0f%% of their mean (ceiling %.1f tok/s)\n",
      p, p * f, f1, f2, 100 * p * f / m, m / f }'
  gbs=$gbs2 sus=$sus2 fma=$fma2 # the probe after this run is the probe before the next
done
