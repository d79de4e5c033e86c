#!/usr/bin/env bash
# Installs every Debian 12 package sbx needs to build, to build its guest image and to
# run its tests. Idempotent: when everything is there already it returns at once.
set -euo pipefail

if [ "${1:-}" = "--help" ]; then
  echo "usage: scripts/install-deps.sh   (as root on Debian 12; safe to run again)"
  exit 0
fi

PACKAGES=(
  # build
  build-essential cmake pkg-config git
  libzmq3-dev libczmq-dev libmsgpack-dev libmicrohttpd-dev libgnutls28-dev
  libsqlite3-dev libdqlite-dev libjansson-dev libsodium-dev libcurl4-openssl-dev libpsl-dev publicsuffix
  # guests and the guest image
  qemu-system-x86 qemu-utils busybox-static mmdebstrap e2fsprogs cpio kmod zstd lz4
  # tests and tools
  python3 python3-venv python3-setuptools python3-wheel sqlite3 curl ca-certificates procps
  iproute2
  # the benchmarks' HTTP load (bench/run)
  wrk
  # an outside rotation of sbx up's logs, as docs/operations.md shows it (test_logs.py)
  logrotate
  # a real browser for the sign-in and consent pages' tests (test_edge_site.py)
  chromium
  # a real balancer in front of several gateways (test_edge_balance.py runs its own, in
  # the foreground, on a free port). On a systemd host the package also starts a
  # haproxy service, but Debian's default /etc/haproxy/haproxy.cfg has no frontend or
  # listen section: it binds no port.
  haproxy
  # a real Prometheus and its promtool, scraping the gateway's /metrics (test_metrics.py
  # runs the binary in the foreground on a free port). On a systemd host the package also
  # starts a prometheus service on :9090 (and installs node-exporter, a recommend, only
  # without --no-install-recommends).
  prometheus
  # the guests' network policy (vmd_firewall: nftables rules on QEMU's user)
  nftables
  # systemd-analyze verify checks packaging/systemd/'s units (test_systemd.py); where
  # systemd is not PID 1 (a container) the package only adds its tools
  systemd
  # the libFuzzer harnesses (fuzz/): clang and its fuzzer and sanitizer runtimes
  clang-14 libclang-rt-14-dev
)
# Node.js and npm (for the MCP SDK client tests) come from Debian's nodejs and npm only
# when no node is installed: machines that ship their own Node.js keep it.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

# QEMU runs as a user of its own: vmd's guest network policy matches that user's
# sockets, and a guest's QEMU can then touch nothing of the host's (docs/vmd.md).
ensure_qemu_user() {
  if [ "$(id -u)" -eq 0 ] && ! getent passwd sbx-qemu >/dev/null; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin sbx-qemu
    echo "[deps] created the system user sbx-qemu (QEMU runs as it)"
  fi
}

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[deps] all ${#PACKAGES[@]} packages present"
  ensure_qemu_user
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "[deps] missing packages: ${missing[*]}; run this script as root" >&2
  exit 1
fi
echo "[deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
ensure_qemu_user
echo "[deps] done"
