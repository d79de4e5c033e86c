#!/usr/bin/env bash
# Installs what sbx needs, builds it, and runs the whole service on this machine:
# `sbx up` with its defaults (data in /var/lib/sbx, HTTPS on 127.0.0.1:8443 with a local
# CA). Arguments go to `sbx up` (see build/bin/sbx up --help).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--help" ]; then
  echo "usage: scripts/up.sh [sbx up options]   (installs, builds, runs; see docs/operations.md)"
  exit 0
fi
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
exec build/bin/sbx up "$@"
