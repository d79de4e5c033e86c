#!/usr/bin/env bash
# Installs what sbx needs, builds it with AddressSanitizer and UBSan (and the libFuzzer
# harnesses with clang), and runs every test (unit, integration, fuzz) under ctest.
# Extra arguments go to ctest (-R, -L, -V).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--help" ]; then
  echo "usage: scripts/test.sh [ctest options]   e.g. -L unit, -R broker, -V"
  exit 0
fi
scripts/install-deps.sh
cmake -S . -B build-test -DSBX_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-test -j"$(nproc)"
# The fuzz harnesses, built with clang in build-fuzz: the fuzz.* tests run each a while.
fuzz/run --build-only
cd build-test
ctest --output-on-failure --timeout 900 "$@"
