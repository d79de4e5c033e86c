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
if [ $# -gt 0 ]; then
  exec ctest --output-on-failure --timeout 900 "$@"
fi
# Unit and fuzz tests two at a time (they share nothing host-wide but vmd_server's
# nftables table, which no other unit test touches); then integration tests two at a time
# too: each holds a slot (tests/integration/sbxtest.py) that gives its vmds their own
# nftables tables and guests' uid range. Most of their time is spent waiting on guests.
rc=0
# The docker variant of the guest image (integration.images boots it) builds beside the
# unit tests: mostly downloads and unpacking. Its fixture, integration.image_docker, then
# finds it up to date, or builds it again and says why it failed.
image_docker=
# (grep reads it all: with pipefail, -q's early exit would fail the listing's make.)
if cmake --build . --target help | grep sbx-image-docker >/dev/null; then
  cmake --build . --target sbx-image-docker >image-docker.log 2>&1 &
  image_docker=$!
fi
ctest --output-on-failure --timeout 900 -L 'unit|fuzz' -j2 || rc=$?
cp Testing/Temporary/LastTest.log Testing/Temporary/LastTest-unit.log 2>/dev/null || true
if [ -n "$image_docker" ]; then
  wait "$image_docker" || echo "the docker variant's build failed (build-test/image-docker.log)"
fi
ctest --output-on-failure --timeout 900 -L integration -j2 || rc=$?
# Each failed test's own words again at the end, where a reader of the run's tail sees them.
if [ "$rc" -ne 0 ]; then
  ../scripts/test-tails.py Testing/Temporary/LastTest-unit.log Testing/Temporary/LastTest.log
fi
exit $rc
