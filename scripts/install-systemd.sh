#!/usr/bin/env bash
# Installs sbx's systemd units (packaging/systemd/: a unit per daemon, sbx-guests.service
# and sbx.target), with this install's paths written into them, and reloads systemd.
# Then: systemctl enable --now sbx.target. See docs/operations.md, "Under systemd".
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin_dir="$repo/build/bin"
data_dir=/var/lib/sbx
unit_dir=/etc/systemd/system
reload=yes

usage() {
  cat <<EOF
usage: scripts/install-systemd.sh [--bin-dir DIR] [--data-dir DIR] [--unit-dir DIR]
                                  [--no-reload]

Writes sbx.target, sbx-guests.service and sbx-{broker,vmd,snapshotd,billing,hookd,gateway}.service
from packaging/systemd/ into the unit directory, with the paths below filled in, then
runs systemctl daemon-reload (when systemd runs this machine). Start everything with
  systemctl enable --now sbx.target
and stop everything (every guest, then every daemon) with
  systemctl stop sbx.target

  --bin-dir DIR   where sbx and the sbx-* daemons are (default $bin_dir)
  --data-dir DIR  the data directory the daemons use (default $data_dir)
  --unit-dir DIR  where the units go (default $unit_dir)
  --no-reload     do not run systemctl daemon-reload
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir|--data-dir|--unit-dir)
      if [ $# -lt 2 ] || [ -z "$2" ]; then
        echo "install-systemd.sh: $1 needs a directory (see --help)" >&2
        exit 2
      fi
      case "$1" in
        --bin-dir) bin_dir="$2" ;;
        --data-dir) data_dir="$2" ;;
        --unit-dir) unit_dir="$2" ;;
      esac
      shift 2 ;;
    --no-reload) reload=no; shift ;;
    --help|-h) usage; exit 0 ;;
    *) echo "install-systemd.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# systemd wants absolute paths, and a path with a space or % would need quoting in
# ExecStart= and specifier escaping: refused rather than half-handled.
for pair in "bin-dir:$bin_dir" "data-dir:$data_dir" "unit-dir:$unit_dir"; do
  name="${pair%%:*}" value="${pair#*:}"
  case "$value" in
    /*) ;;
    *) echo "install-systemd.sh: --$name must be an absolute path, not '$value'" >&2; exit 2 ;;
  esac
  case "$value" in
    *[[:space:]%\\\"\']*)
      echo "install-systemd.sh: --$name '$value' has a space, %, quote or backslash; choose another path" >&2
      exit 2 ;;
  esac
done
for exe in sbx sbx-broker sbx-vmd sbx-snapshotd sbx-billing sbx-hookd sbx-gateway; do
  if [ ! -x "$bin_dir/$exe" ]; then
    echo "install-systemd.sh: $bin_dir/$exe is missing: build sbx first (cmake --build build) or give --bin-dir" >&2
    exit 1
  fi
done

mkdir -p "$unit_dir"
for src in "$repo"/packaging/systemd/*.service "$repo"/packaging/systemd/*.target; do
  unit="$(basename "$src")"
  sed -e "s|@BINDIR@|$bin_dir|g" -e "s|@DATADIR@|$data_dir|g" -e "s|@DOCDIR@|$repo/docs|g" \
    "$src" >"$unit_dir/$unit.tmp"
  mv "$unit_dir/$unit.tmp" "$unit_dir/$unit"
  echo "installed $unit_dir/$unit"
done
# The data directory the units name (ReadWritePaths= needs it to exist).
mkdir -p "$data_dir"

if [ "$reload" = yes ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  echo "systemd reloaded; start with: systemctl enable --now sbx.target"
elif [ "$reload" = yes ]; then
  echo "systemd does not run this machine: units written, nothing reloaded"
fi
