#!/usr/bin/env bash
# boot-check.sh IMAGE_DIR [options] — boot the guest image under QEMU microvm and
# check it (python3, python, hostname, /dev/virtio-ports/agent, 10.0.2.15, the agent
# port). The work is done by boot-check.py (Python 3 standard library); see --help.
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
    exec /usr/bin/env python3 "$(dirname "${BASH_SOURCE[0]}")/boot-check.py" --help
fi
exec /usr/bin/env python3 "$(dirname "${BASH_SOURCE[0]}")/boot-check.py" "$@"
