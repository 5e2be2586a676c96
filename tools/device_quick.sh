#!/usr/bin/env bash
# A short device call (the fourth session's measurements, BENCHMARKS.md):
# the GPU tests with one summary line each, then `tessera passes` by row
# count and two decode runs per assembly on a Llama-3-8B-shaped random bf16
# checkpoint. Expects a build carried in .device/ (tools/device_pack.sh).
# Env: TESTS (test binaries; default all nine), PASSES and RUNS (assembly
# names; default cuda-fast cuda-fast-fp8), MOE_PASSES (assembly names whose
# one- and 8-row passes are also measured on a qwen3moe-7b-a1b-shaped random
# checkpoint; default none: it takes ~25 s to write). With variants packed
# (.device/build/var/NAME: tools/device_pack.sh's OLD_BUILD, as "old", and
# VARIANTS) every pass and run is measured in two interleaved rounds: the
# catalog as built, then with each variant's plugins swapped in ("(NAME)"
# lines). IDS=1: then the 8B shape's greedy
# token ids of a 700-token run (random 512-token prompt) as an md5 for each
# catalog in turn (each twice with variants: whether they repeat from run
# to run, and whether a change moved them), and stories260K's
# greedy text's md5 through each RUNS assembly. PROFILE=1: also each PASSES
# assembly's one-row pass with --profile (each op waited for) per catalog,
# to say which op a change moved. tools/device_cuda.sh is the full
# call (greedy text of every CUDA assembly, sampled decode, more runs).
cd "$(dirname "$0")/.."
[ -f .device/build.tar.xz ] && tar xJf .device/build.tar.xz -C .device # tools/device_pack.sh
B=.device/build
export LD_LIBRARY_PATH=$PWD/.device/lib TESSERA_SOURCE_DIR=$PWD TESSERA_CATALOG=$PWD/$B/catalog
chmod 755 $B/catalog $B/catalog/*.so; chmod 644 $B/catalog/*.yaml
CK=/tmp/llama3-8b
[ -d $CK ] || python3 .device/mk_random_checkpoint.py llama3-8b $CK > /dev/null &
MOE=/tmp/qwen3moe-7b-a1b
[ -n "${MOE_PASSES:-}" ] && { [ -d $MOE ] || python3 .device/mk_random_checkpoint.py qwen3moe-7b-a1b $MOE > /dev/null & }
for t in ${TESTS:-test_cuda test_cuda_prefill test_cuda_fp8 test_cuda_gemv test_cuda_paged test_cuda_paged_kernels test_cuda_sample test_cuda_fp8_ckpt test_cuda_moe_ops}; do
  MK_FP8_CHECKPOINT=$PWD/$B/bin/mk_fp8_checkpoint $B/tests/bin/$t > /tmp/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' /tmp/$t.log | tr '\n' ' ')"
  grep -E "FAILED|fail|Error|error" /tmp/$t.log | grep -v "^\[  PASSED" | head -5
done
wait
CATS="$PWD/$B/catalog" # the catalogs measured: as built, then each variant (A/B/...), two rounds
if [ -d $B/var ]; then
  VS=$(ls $B/var) CATS=""
  for v in $VS; do
    rm -rf /tmp/cat-$v && cp -r $B/catalog /tmp/cat-$v && cp $B/var/$v/* /tmp/cat-$v/
    chmod 755 /tmp/cat-$v/*.so; chmod 644 /tmp/cat-$v/*.yaml
  done
  for r in 1 2; do CATS="$CATS $PWD/$B/catalog$(for v in $VS; do echo -n " /tmp/cat-$v"; done)"; done
fi
name() { case $1 in /tmp/cat-*) echo " (${1#/tmp/cat-})" ;; esac; }
for a in ${PASSES:-cuda-fast cuda-fast-fp8}; do
  for c in $CATS; do
    echo "== passes $a$(name $c)"
    TESSERA_CATALOG=$c $B/bin/tessera passes assemblies/$a.yaml --model $CK --context 512 --rows 1,2,4,8 --reps 20 2>&1 | grep -E "rows|error"
  done
done
if [ -n "${PROFILE:-}" ]; then # which op a change moved: each op waited for, per catalog
  for a in ${PASSES:-cuda-fast cuda-fast-fp8}; do
    for c in $CATS; do
      echo "== profile $a$(name $c)"
      TESSERA_CATALOG=$c $B/bin/tessera passes assemblies/$a.yaml --model $CK --context 512 --rows 1 --reps 20 \
        --profile 2>&1 | grep -E "us/call|rows|error"
    done
  done
fi
for a in ${MOE_PASSES:-}; do
  echo "== passes $a (qwen3moe-7b-a1b)"
  $B/bin/tessera passes assemblies/$a.yaml --model $MOE --context 512 --rows 1,8 --reps 20 2>&1 | grep -E "rows|error"
done
for a in ${RUNS:-cuda-fast cuda-fast-fp8}; do
  for c in $CATS; do
    echo -n "$a$(name $c): "
    TESSERA_CATALOG=$c $B/bin/tessera run assemblies/$a.yaml --model $CK --random-prompt 512 -n 256 2>&1 | grep -E "tok/s|error" | tr '\n' ' '
    echo
  done
  [ -d $B/var ] || { echo -n "$a: "; $B/bin/tessera run assemblies/$a.yaml --model $CK --random-prompt 512 -n 256 2>&1 | grep -E "tok/s|error" | tr '\n' ' '; echo; }
done
if [ -n "${IDS:-}" ]; then
  for a in ${RUNS:-cuda-fast cuda-fast-fp8}; do
    for c in $CATS; do
      echo "ids $a$(name $c): $(TESSERA_CATALOG=$c $B/bin/tessera run assemblies/$a.yaml --model $CK --random-prompt 512 -n 700 2>/dev/null | md5sum)"
    done
    echo "stories260K $a: $($B/bin/tessera run assemblies/$a.yaml -p 'Once upon a time' -n 48 --ignore-eos 2>/dev/null | md5sum)"
  done
fi
