#!/usr/bin/env bash
# Packs the local CUDA build (build/) into .device/ for the device tool
# (carry [".device"]): binaries, the catalog (unstripped: the manifests pin
# each library's sha256), the GPU tests, the libraries the device image
# lacks, the checkpoint generator (mk_fp8_checkpoint is in bin/) and the
# pystd mixture of experts, and Qwen3's tokenizer (tools/device_ablate.sh). The binaries and libraries go as one xz archive
# (.device/build.tar.xz, ~4 MB against ~21 MB: the carried tree must stay
# under 64 MiB with the 29 MB model); device scripts unpack it first:
#   tar xJf .device/build.tar.xz -C .device
# Env: SLIM=1 leaves the tokenizer and the mixture of experts out (the
# carried tree stays small; what needs them then fails plainly). OLD_BUILD
# (another build folder) with OLD_PLUGINS (names) packs those plugins'
# libraries and manifests from it as the variant "old"; VARIANTS (NAME=DIR
# ..., each DIR holding plugin libraries and their manifests as a build's
# catalog does, e.g. copied from it after building a change) packs more.
# tools/device_quick.sh then measures every variant (the build's catalog
# with those plugins swapped in) interleaved with the build as packed (A/B
# or A/B/C... in one call).
set -eu
cd "$(dirname "$0")/.."
rm -rf .device/build && mkdir -p .device/build/tests/bin .device/lib
cp -r build/bin build/catalog .device/build/
cp build/tests/bin/test_cuda* .device/build/tests/bin/
strip .device/build/bin/* .device/build/tests/bin/*
for l in libyaml-0.so.2 liblua5.4.so.0 libmicrohttpd.so.12 libcmocka.so.0; do
  cp -L /usr/lib/x86_64-linux-gnu/$l .device/lib/
done
cp ../shared/tools/mk_random_checkpoint.py .device/
rm -rf .device/tok .device/shared
if [ -z "${SLIM:-}" ]; then
  # Qwen3's tokenizer (11 MB) for the 8B-shaped ablation (tools/device_ablate.sh)
  mkdir -p .device/tok && cp ../shared/data/tokenizers/qwen3/tokenizer.json ../shared/data/tokenizers/qwen3/tokenizer_config.json .device/tok/
  # the trained mixture of experts (29 MB; TESSERA_SHARED_DIR=.device/shared on the device)
  mkdir -p .device/shared/data/models/pystd
  cp -r ../shared/data/models/pystd/moe .device/shared/data/models/pystd/
fi
if [ -n "${OLD_BUILD:-}" ]; then # the old side of an A/B: those plugins as another build made them
  mkdir -p .device/build/var/old
  for p in ${OLD_PLUGINS:?OLD_PLUGINS names the plugins taken from OLD_BUILD}; do
    cp "$OLD_BUILD/catalog/lib$p.so" "$OLD_BUILD/catalog/$p.yaml" .device/build/var/old/
  done
fi
for v in ${VARIANTS:-}; do # NAME=DIR: the plugins DIR holds, swapped into the catalog as variant NAME
  n=${v%%=*} d=${v#*=}
  case $v in *=*) ;; *) n="";; esac
  case $n in ''|*[!A-Za-z0-9_-]*) echo "VARIANTS: '$v' is not NAME=DIR (NAME: letters, digits, - or _)" >&2; exit 2;; esac
  mkdir -p .device/build/var/$n && cp "$d"/lib*.so "$d"/*.yaml .device/build/var/$n/
done
tar cJf .device/build.tar.xz -C .device build lib && rm -rf .device/build .device/lib
du -sh .device
# what the reports made there will name as built_from (commit before building: "+modified" otherwise)
build/bin/tessera --version
