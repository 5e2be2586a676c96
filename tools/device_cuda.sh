#!/usr/bin/env bash
# One device call: correctness of the CUDA assemblies against transformers,
# then batch-1 speed on a Llama-3-8B-shaped random bf16 checkpoint.
# Expects a build carried in .device/ (tools/device_pack.sh makes it).
# Env: ASSEMBLIES (default: the CUDA assemblies), REPS (3), SHAPE (llama3-8b),
# TESTS=0 to skip the GPU tests, SAMPLED=0 the sampled decode runs.
set -u
cd "$(dirname "$0")/.."
[ -f .device/build.tar.xz ] && tar xJf .device/build.tar.xz -C .device # tools/device_pack.sh
B=.device/build
export LD_LIBRARY_PATH=$PWD/.device/lib:${LD_LIBRARY_PATH:-}
export TESSERA_SOURCE_DIR=$PWD TESSERA_CATALOG=$PWD/$B/catalog
chmod 755 $B/catalog && chmod 755 $B/catalog/*.so && chmod 644 $B/catalog/*.yaml
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
ldd $B/bin/tessera | grep "not found"
if [ "${TESTS:-1}" = 1 ]; then
  echo "== stories260K greedy text through each CUDA assembly"
  for a in cuda-baseline cuda-fast-eager cuda-fast cuda-fast-fp8 cuda-fast-paged cuda-fast-paged-fp8; do
    $B/bin/tessera run assemblies/$a.yaml -p "Once upon a time" -n 48 --ignore-eos; echo " (exit $?)"
  done
  echo "== GPU tests against transformers"
  $B/tests/bin/test_cuda
  echo "== prefill attention kernel against an f64 reference"
  $B/tests/bin/test_cuda_prefill
  echo "== FP8 gemv: kernels against an f64 product, cuda-fast-fp8 against transformers"
  $B/tests/bin/test_cuda_fp8
  echo "== decode GEMV kernels (cuda_gemv, cuda_gemv_fp8) against an f64 product"
  $B/tests/bin/test_cuda_gemv
  echo "== paged KV (bf16, fp8): against transformers and contiguous KV, rollback, pool exhaustion"
  $B/tests/bin/test_cuda_paged
  echo "== paged KV and attention called directly at model shapes against f64"
  $B/tests/bin/test_cuda_paged_kernels
  echo "== sampling on the device against the CPU sampler; seeded sampled stories260K end to end"
  $B/tests/bin/test_cuda_sample
  echo "== FP8 checkpoints read as stored: cuda-fast-fp8 against ref_gemv on the same checkpoint"
  MK_FP8_CHECKPOINT=$PWD/$B/bin/mk_fp8_checkpoint $B/tests/bin/test_cuda_fp8_ckpt
fi
SHAPE=${SHAPE:-llama3-8b}
echo "== $SHAPE-shaped random bf16 checkpoint"
CK=/tmp/$SHAPE
[ -d $CK ] || python3 .device/mk_random_checkpoint.py $SHAPE $CK > /dev/null
if [ "${SAMPLED:-1}" = 1 ]; then
  echo "== sampled decode on cuda-fast (t 0.8, top-p 0.95): on the device, then with --host-sampling"
  for mode in "" --host-sampling; do
    for rep in $(seq ${REPS:-3}); do
      echo -n "cuda-fast sampled ${mode:-device}: "
      $B/bin/tessera run assemblies/cuda-fast.yaml --model $CK --random-prompt 512 -n 256 --temp 0.8 --top-p 0.95 \
        --seed $rep $mode 2>&1 | grep -E "tok/s|error" | tr '\n' ' '
      echo
    done
  done
fi
for a in ${ASSEMBLIES:-cuda-baseline cuda-fast-eager cuda-fast cuda-fast-fp8 cuda-fast-paged cuda-fast-paged-fp8}; do
  for rep in $(seq ${REPS:-3}); do
    echo -n "$a: "
    $B/bin/tessera run assemblies/$a.yaml --model $CK --random-prompt 512 -n 256 2>&1 | grep -E "tok/s|error" | tr '\n' ' '
    echo
  done
done
