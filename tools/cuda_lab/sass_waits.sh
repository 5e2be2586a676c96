#!/usr/bin/env bash
# sass_waits.sh - on the device (cuobjdump is there, not on the CPU machines):
# for each kernel of each cubin or plugin library given, the global loads its
# SASS issues before its first ACQBULK (griddepcontrol.wait, the programmatic
# dependent's wait: kernels/cuda/pdl.cuh), and how many of them take the
# read-only path (LDG...CONSTANT). A load before the wait may only read what
# no kernel of the pass writes (weights, norm weights): gemv_mma's weight
# loads are there on purpose; an activation load there is the race the
# thirty-sixth session found (BENCHMARKS.md). Loads are not told apart by what
# they read: compare two builds (A B) to see which kernels a change moved.
#   bash tools/cuda_lab/sass_waits.sh A.cubin|libX.so [B.cubin|libX.so]
# Prints "kernel loads-before-wait read-only-ones" for kernels that wait and
# load before it; with two files, only the kernels whose counts differ.
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
OBJ=${CUOBJDUMP:-/usr/local/cuda/bin/cuobjdump}
count() { # file -> lines "kernel before constant waits"
  "$OBJ" -sass "$1" | awk '
    /Function :/ { if (fn != "") print fn, before, cnst, seen; fn = $3
                   gsub(/_GLOBAL__N__[0-9a-f_]+/, "ANON", fn); before = 0; cnst = 0; seen = 0; next }
    /ACQBULK/ { seen = 1 }
    /LDG/ { if (!seen) { before++; if ($0 ~ /CONSTANT/) cnst++ } }
    END { if (fn != "") print fn, before, cnst, seen }' | sort
}
if [ $# -eq 1 ]; then
  count "$1" | awk '$4 == 1 && $2 > 0 { print $1, $2, $3 }'
else
  join <(count "$1") <(count "$2") | awk '$2 != $5 || $3 != $6 { print $1, $2 " -> " $5, $3 " -> " $6 }'
fi
