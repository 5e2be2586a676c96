#!/usr/bin/env bash
# Packs the local CUDA build (build/) into .device/ for the device tool
# (carry [".device"]): binaries, the catalog (unstripped: the manifests pin
# each library's sha256), the GPU tests, the libraries the device image
# lacks, and the checkpoint generator (mk_fp8_checkpoint is in bin/).
set -eu
cd "$(dirname "$0")/.."
rm -rf .device/build && mkdir -p .device/build/tests/bin .device/lib
cp -r build/bin build/catalog .device/build/
cp build/tests/bin/test_cuda build/tests/bin/test_cuda_prefill build/tests/bin/test_cuda_fp8 build/tests/bin/test_cuda_gemv \
   build/tests/bin/test_cuda_paged build/tests/bin/test_cuda_paged_kernels build/tests/bin/test_cuda_sample \
   build/tests/bin/test_cuda_fp8_ckpt .device/build/tests/bin/
strip .device/build/bin/* .device/build/tests/bin/*
for l in libyaml-0.so.2 liblua5.4.so.0 libmicrohttpd.so.12 libcmocka.so.0; do
  cp -L /usr/lib/x86_64-linux-gnu/$l .device/lib/
done
cp ../shared/tools/mk_random_checkpoint.py .device/
du -sh .device
