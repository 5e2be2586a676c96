#!/usr/bin/env bash
# Builds tessera and runs the whole test suite (the README's test command).
# TESSERA_SANITIZE=1 builds with ASan + UBSan into build-asan instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TESSERA_SANITIZE:-0}" = 1 ]; then
  dir=build-asan; flags="-DTESSERA_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"
else
  dir=build; flags=""
fi
cmake -S . -B "$dir" $flags >/dev/null
cmake --build "$dir" -j"$(nproc)"
cd "$dir" && ctest --output-on-failure -j"$(nproc)"
