#!/usr/bin/env bash
# One device call: correctness of the CUDA assemblies against transformers,
# then batch-1 speed on a Llama-3-8B-shaped random bf16 checkpoint.
# Expects a build carried in .device/ (see BENCHMARKS.md for how it is made).
set -u
cd "$(dirname "$0")/.."
B=.device/build
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
export TESSERA_SOURCE_DIR=$PWD TESSERA_CATALOG=$PWD/$B/catalog
chmod 755 $B/catalog && chmod 755 $B/catalog/*.so && chmod 644 $B/catalog/*.yaml
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
ldd $B/bin/tessera | grep "not found"
echo "== stories260K greedy text through each CUDA assembly"
for a in cuda-baseline cuda-fast; do
  $B/bin/tessera run assemblies/$a.yaml -p "Once upon a time" -n 48 --ignore-eos; rc=$?; echo " (exit $rc)"
  if [ $rc -ge 128 ] && command -v cuda-gdb >/dev/null; then
    cuda-gdb -batch -ex run -ex bt --args $B/bin/tessera run assemblies/$a.yaml -p "Once upon a time" -n 8 2>&1 | tail -25
  fi
done
echo "== GPU tests against transformers"
$B/tests/bin/test_cuda
echo "== Llama-3-8B-shaped random bf16 checkpoint"
CK=/tmp/llama3-8b
[ -d $CK ] || python3 .device/mk_random_checkpoint.py llama3-8b $CK > /dev/null
for a in ${ASSEMBLIES:-cuda-baseline cuda-fast}; do
  for rep in $(seq ${REPS:-3}); do
    $B/bin/tessera run assemblies/$a.yaml --model $CK --random-prompt 512 -n 256 2>&1 | grep -E "tok/s|error"
  done
done
