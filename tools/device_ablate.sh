#!/usr/bin/env bash
# tessera ablate of ASM (default cuda-fast) on the device at a real size: a
# Qwen3-8B-shaped random bf16 checkpoint (written once a machine, ~35 s)
# with Qwen3's tokenizer.json, workload ablation/workloads/gpu8b.json,
# --no-kl (random weights). Expects a build carried in .device/
# (tools/device_pack.sh, which also carries the tokenizer). 16 variants of
# cuda-fast took 400 s of a 10-minute call (BENCHMARKS.md, twenty-fourth
# session). The four report files go to $OUT (a call returns at most 8
# files: never the whole output folder), also when the ablation is cut
# short by LIMIT: its result.json then holds the variants measured, and a
# later call at the same commit continues it: copy that result.json to
# .device/resume/ here, then call with RESUME=--resume (on a fresh machine
# the checkpoint is written again).
# Env: ASM, LIMIT (seconds for the ablation, default 500), RESUME.
cd "$(dirname "$0")/.."
[ -f .device/build.tar.xz ] && tar xJf .device/build.tar.xz -C .device
B=.device/build
export LD_LIBRARY_PATH=$PWD/.device/lib TESSERA_CATALOG=$PWD/$B/catalog TESSERA_SOURCE_DIR=$PWD
chmod 755 $B/catalog $B/catalog/*.so; chmod 644 $B/catalog/*.yaml
CK=/tmp/qwen3-8b ASM=${ASM:-cuda-fast}
D=/tmp/abl-$ASM
t0=$(date +%s)
[ -f $CK/tokenizer.json ] || { python3 .device/mk_random_checkpoint.py qwen3-8b $CK > /dev/null &&
                               cp .device/tok/tokenizer.json .device/tok/tokenizer_config.json $CK/; }
echo "checkpoint ready after $(( $(date +%s) - t0 )) s"
if [ -n "${RESUME:-}" ]; then mkdir -p $D && cp .device/resume/result.json $D/ || exit 1; fi
timeout ${LIMIT:-500} $B/bin/tessera ablate assemblies/$ASM.yaml --model $CK --workload ablation/workloads/gpu8b.json \
    --out $D --chat-format chatml --ctx 4096 --no-kl --quiet ${RESUME:-} 2>&1 | tail -20
for f in report.md result.json result.csv speedup.svg; do [ -f $D/$f ] && cp $D/$f "$OUT/"; done
echo "ablate ended after $(( $(date +%s) - t0 )) s"
