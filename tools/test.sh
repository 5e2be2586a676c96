#!/usr/bin/env bash
# Builds tessera and runs the whole test suite (the README's test command).
# TESSERA_SANITIZE=1 builds with ASan + UBSan into build-asan instead;
# TESSERA_VALGRIND=1 into build-valgrind (no CUDA: the GPU tests skip on this
# machine anyway) and runs every CMocka test under valgrind memcheck.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TESSERA_SANITIZE:-0}" = 1 ]; then
  dir=build-asan; flags="-DTESSERA_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"
elif [ "${TESSERA_VALGRIND:-0}" = 1 ]; then
  command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
  dir=build-valgrind; flags="-DTESSERA_VALGRIND=ON -DTESSERA_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo"
else
  dir=build; flags=""
fi
cmake -S . -B "$dir" $flags >/dev/null
cmake --build "$dir" -j"$(nproc)"
cd "$dir" && ctest --output-on-failure -j"$(nproc)"
