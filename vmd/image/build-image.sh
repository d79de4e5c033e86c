#!/usr/bin/env bash
# build-image.sh — build the sbx guest image (kernel, initramfs, root filesystem)
# from Debian 12 (bookworm) packages. See vmd/image/README.md.
set -euo pipefail

# Descriptors inherited from whoever runs this (ctest, flock, make) are closed: mmdebstrap
# hands apt its next free descriptor, and dash cannot redirect one above 9 ("cat >&11":
# "Bad fd number"). 255 is bash's own, reading this script.
for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    case "$fd" in 0 | 1 | 2 | 255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
done

usage() {
    cat <<'EOF'
Usage: build-image.sh [options] OUT_DIR

Builds the sbx guest image from Debian 12 (bookworm) packages into OUT_DIR:
  vmlinux        uncompressed ELF kernel (PVH entry) from linux-image-*-cloud-amd64
  initrd.img     tiny initramfs: static busybox, virtio modules, /init (vmd/image/init)
  rootfs.ext4    ext4 root filesystem (mmdebstrap + mke2fs -d), /sbin/sbx-init
  manifest.json  kernel version, packages, sizes, build time, input hash

The build is cached: if OUT_DIR/manifest.json carries the same input hash (this
script, the files in vmd/image/, the package list, the agent binary, the kernel
package version) and all artifacts exist, it prints "guest image up to date" and
exits. A build happens in a temporary directory beside OUT_DIR and is renamed into
place at the end. Downloaded .debs, the kernel files and the installed package tree
are cached in CACHE_DIR (default $SBX_IMAGE_CACHE or /var/cache/sbx-image).

Options:
  --agent PATH        install PATH as /usr/sbin/sbx-agent (mode 0755) in the rootfs
  --variant NAME      default, or a variant of vmd/image/variants/NAME.conf: its
                      packages added, its kernel modules in the rootfs (e.g. docker)
  --packages "A B"    extra Debian packages for the rootfs (added to packages.txt)
  --kernel-package P  kernel package or metapackage (default linux-image-cloud-amd64)
  --free-mib N        free space to leave in rootfs.ext4 (default 512, or the
                      variant's free_mib)
  --initrd-compress C none | gzip (default none: boots faster, see README)
  --cache-dir DIR     cache directory (default $SBX_IMAGE_CACHE or /var/cache/sbx-image)
  --force             rebuild even if OUT_DIR is up to date
  --no-cache          ignore (and refresh) the cached package tree and .debs
  --keep-tmp          keep the temporary build directory (for debugging)
  -h, --help          show this help

Runs as root. Needs: apt-get, mmdebstrap, e2fsprogs (mke2fs -d), kmod (depmod,
modprobe), cpio, busybox-static, lz4/xz-utils/zstd/gzip/bzip2 (kernel extraction).
EOF
}

# ---------------------------------------------------------------- arguments
AGENT='' EXTRA_PACKAGES='' KERNEL_PACKAGE=linux-image-cloud-amd64 FREE_MIB='' VARIANT=default
INITRD_COMPRESS=none CACHE_DIR='' FORCE='' NO_CACHE='' KEEP_TMP='' OUT=
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage; exit 0 ;;
    --agent) AGENT=${2:?--agent needs a path}; shift 2 ;;
    --agent=*) AGENT=${1#*=}; shift ;;
    --variant) VARIANT=${2:?--variant needs a name}; shift 2 ;;
    --variant=*) VARIANT=${1#*=}; shift ;;
    --packages) EXTRA_PACKAGES=${2?--packages needs a list}; shift 2 ;;
    --packages=*) EXTRA_PACKAGES=${1#*=}; shift ;;
    --kernel-package) KERNEL_PACKAGE=${2:?}; shift 2 ;;
    --kernel-package=*) KERNEL_PACKAGE=${1#*=}; shift ;;
    --free-mib) FREE_MIB=${2:?}; shift 2 ;;
    --free-mib=*) FREE_MIB=${1#*=}; shift ;;
    --initrd-compress) INITRD_COMPRESS=${2:?}; shift 2 ;;
    --initrd-compress=*) INITRD_COMPRESS=${1#*=}; shift ;;
    --cache-dir) CACHE_DIR=${2:?}; shift 2 ;;
    --cache-dir=*) CACHE_DIR=${1#*=}; shift ;;
    --force) FORCE=1; shift ;;
    --no-cache) NO_CACHE=1; FORCE=1; shift ;;
    --keep-tmp) KEEP_TMP=1; shift ;;
    --) shift; break ;;
    -*) echo "build-image.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$OUT" ] || { echo "build-image.sh: more than one OUT_DIR" >&2; exit 2; }
       OUT=$1; shift ;;
    esac
done
[ $# -eq 0 ] || { [ -z "$OUT" ] && [ $# -eq 1 ] && OUT=$1; } || { echo "build-image.sh: too many arguments" >&2; exit 2; }
[ -n "$OUT" ] || { usage >&2; exit 2; }
case "$INITRD_COMPRESS" in none | gzip) ;; *) echo "build-image.sh: --initrd-compress none|gzip" >&2; exit 2 ;; esac
[ -z "$FREE_MIB" ] || [[ "$FREE_MIB" =~ ^[0-9]+$ ]] || { echo "build-image.sh: --free-mib needs a number" >&2; exit 2; }

T0=$EPOCHREALTIME
elapsed() { local now=$EPOCHREALTIME; echo "$(( (${now/./} - ${T0/./}) / 10000 ))e-2"; }
log() { printf '[image] %5.1fs %s\n' "$(elapsed)" "$*"; }
die() { echo "[image] error: $*" >&2; exit 1; }
# prefix each line of stdin with the build's elapsed seconds (for the step logs)
stamp() {
    local line
    while IFS= read -r line; do
        printf '%7.2f %s\n' "$(elapsed)" "$line"
    done
}

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LC_ALL=C

# ---------------------------------------------------------------- the variant
# variants/NAME.conf: `packages = ...` and `modules = ...` lines (they add up) and
# `free_mib = N`. Read before the root check, so that a bad variant is said at once.
VARIANT_PACKAGES='' VARIANT_MODULES='' VARIANT_CONF=''
if [ "$VARIANT" != default ]; then
    [[ "$VARIANT" =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "--variant '$VARIANT': a name of lowercase letters, digits and '-'"
    VARIANT_CONF=$SRC/variants/$VARIANT.conf
    [ -f "$VARIANT_CONF" ] || die "--variant $VARIANT: no $VARIANT_CONF (variants: default $(cd "$SRC/variants" 2>/dev/null && ls -- *.conf 2>/dev/null | sed 's/\.conf$//' | tr '\n' ' ' | sed 's/ $//'))"
    lineno=0
    while IFS= read -r line || [ -n "$line" ]; do
        lineno=$((lineno + 1))
        line=${line%%#*}
        [[ "$line" =~ ^[[:space:]]*$ ]] && continue
        [[ "$line" =~ ^[[:space:]]*([a-z_]+)[[:space:]]*=[[:space:]]*(.*[^[:space:]])[[:space:]]*$ ]] ||
            die "$VARIANT_CONF:$lineno: expected 'key = value'"
        key=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
        case "$key" in
        packages) VARIANT_PACKAGES+=" $value" ;;
        modules) VARIANT_MODULES+=" $value" ;;
        free_mib)
            [[ "$value" =~ ^[0-9]+$ ]] || die "$VARIANT_CONF:$lineno: free_mib needs a number"
            [ -n "$FREE_MIB" ] || FREE_MIB=$value ;;
        *) die "$VARIANT_CONF:$lineno: unknown key '$key' (packages, modules, free_mib)" ;;
        esac
    done <"$VARIANT_CONF"
    VARIANT_MODULES=$(tr -s ' \t' '\n' <<<"$VARIANT_MODULES" | sed '/^$/d' | sort -u | tr '\n' ' ')
    VARIANT_MODULES=${VARIANT_MODULES% }
    for m in $VARIANT_MODULES; do
        [[ "$m" =~ ^[A-Za-z0-9_./-]+$ && "$m" != *..* && "$m" != /* ]] ||
            die "$VARIANT_CONF: module path '$m': relative to the kernel's module tree, no '..'"
    done
fi
FREE_MIB=${FREE_MIB:-512}
[ "$(id -u)" = 0 ] || die "must run as root"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PARENT=$(dirname "$OUT")
CACHE_DIR=${CACHE_DIR:-${SBX_IMAGE_CACHE:-/var/cache/sbx-image}}
mkdir -p "$CACHE_DIR/debs"
CACHE_DIR=$(cd "$CACHE_DIR" && pwd)

if [ -n "$AGENT" ]; then
    [ -f "$AGENT" ] || die "--agent $AGENT: no such file"
    AGENT=$(cd "$(dirname "$AGENT")" && pwd)/$(basename "$AGENT")
fi

# ---------------------------------------------------------------- inputs
# package list: packages.txt (comments stripped) + --packages, sorted, unique
PACKAGES=$( { sed -e 's/#.*//' "$SRC/packages.txt"; echo "$VARIANT_PACKAGES $EXTRA_PACKAGES"; } | tr -s ' \t,' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')
PACKAGES=${PACKAGES% }
[ -n "$PACKAGES" ] || die "empty package list"

# The kernel package version comes from the host's apt lists. apt-cache takes ~0.5 s
# here (no pkgcache.bin), so remember the answer, keyed by the lists' names, sizes and
# mtimes: the up-to-date check then needs no apt call at all.
apt_lists_fingerprint() {
    { stat -c '%n %s %Y' /var/lib/apt/lists/*Packages* 2>/dev/null || true; echo "$KERNEL_PACKAGE"; } | sha256sum | cut -c1-32
}
resolve_kernel() {
    local fp=$1 pkg ver
    pkg=$KERNEL_PACKAGE
    # a metapackage (linux-image-cloud-amd64) depends on the real one (linux-image-6.1.0-N-cloud-amd64)
    if ! apt-cache show --no-all-versions "$pkg" 2>/dev/null | grep -q '^Filename:.*/linux-image-[0-9]'; then
        pkg=$(apt-cache depends "$pkg" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -1)
    fi
    [ -n "$pkg" ] || return 1
    ver=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | sed -n 's/^Version: //p' | head -1)
    [ -n "$ver" ] || return 1
    echo "$pkg $ver" >"$CACHE_DIR/kernel-resolve.$fp"
}
FP=$(apt_lists_fingerprint)
if [ ! -s "$CACHE_DIR/kernel-resolve.$FP" ]; then
    if ! ls /var/lib/apt/lists/*Packages* >/dev/null 2>&1; then
        log "apt-get update (no package lists on this host)"
        apt-get update -qq
        FP=$(apt_lists_fingerprint)
    fi
    rm -f "$CACHE_DIR"/kernel-resolve.*
    resolve_kernel "$FP" || { log "apt-get update ($KERNEL_PACKAGE not found)"; apt-get update -qq; FP=$(apt_lists_fingerprint); resolve_kernel "$FP"; } ||
        die "cannot resolve kernel package $KERNEL_PACKAGE with apt-cache"
fi
read -r KPKG KVERSION <"$CACHE_DIR/kernel-resolve.$FP"

AGENT_SHA=none
[ -z "$AGENT" ] || AGENT_SHA=$(sha256sum <"$AGENT" | cut -d' ' -f1)

# files under vmd/image/ that shape the output (not the docs or the boot check, nor
# other variants than this one: a change to docker.conf leaves the default image be)
mapfile -t SRC_FILES < <(cd "$SRC" && find . -type f ! -name '*.md' ! -name 'boot-check*' \
    ! -path '*/__pycache__/*' ! -name '*~' ! -name '.*' \( ! -path './variants/*' -o -path "./variants/$VARIANT.conf" \) | sort)
INPUT_HASH=$( {
    echo "sbx-image-format 1"
    [ "$VARIANT" = default ] || echo "variant $VARIANT modules $VARIANT_MODULES"
    echo "kernel $KPKG $KVERSION"
    echo "packages $PACKAGES"
    echo "agent $AGENT_SHA"
    echo "free-mib $FREE_MIB initrd-compress $INITRD_COMPRESS"
    (cd "$SRC" && sha256sum "${SRC_FILES[@]}")
} | sha256sum | cut -d' ' -f1)

if [ -z "$FORCE" ] && [ -f "$OUT/manifest.json" ] && [ -s "$OUT/vmlinux" ] &&
    [ -s "$OUT/initrd.img" ] && [ -s "$OUT/rootfs.ext4" ] &&
    grep -q "\"input_hash\": \"$INPUT_HASH\"" "$OUT/manifest.json"; then
    echo "guest image up to date ($OUT)"
    exit 0
fi

# ---------------------------------------------------------------- build
for tool in mmdebstrap mke2fs depmod modprobe cpio busybox dpkg-deb apt-get; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install mmdebstrap e2fsprogs kmod cpio busybox-static)"
done
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] || BUSYBOX=$(command -v busybox)
file -b "$BUSYBOX" 2>/dev/null | grep -q 'statically linked' || ldd "$BUSYBOX" 2>&1 | grep -q 'not a dynamic' ||
    die "$BUSYBOX is not static (apt-get install busybox-static)"

# One build at a time per cache directory (images and variants share its .debs, kernel
# files and package trees); a second waits here, then finds its image up to date or not.
exec 9>"$CACHE_DIR/lock"
if ! flock -n 9; then
    log "waiting for another build with $CACHE_DIR"
    flock 9
    if [ -z "$FORCE" ] && [ -f "$OUT/manifest.json" ] && grep -q "\"input_hash\": \"$INPUT_HASH\"" "$OUT/manifest.json"; then
        echo "guest image up to date ($OUT)"
        exit 0
    fi
fi
log "building $OUT (variant $VARIANT, input hash ${INPUT_HASH:0:16}, kernel $KPKG $KVERSION)"
TMP=$(mktemp -d "$PARENT/$(basename "$OUT").tmp.XXXXXX")
# Scratch trees (package tree, unpacked kernel, initramfs) go to tmpfs when there is
# room: creating ~5000 files on this disk costs ~4 s of kernel time, on tmpfs 0.2 s.
WORK=$TMP/work
if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -gt $((2 * 1024 * 1024)) ]; then
    WORK=$(mktemp -d /dev/shm/sbx-image-build.XXXXXX)
fi
mkdir -p "$WORK"
KPID=''
cleanup() {
    local rc=$?
    [ -z "$KPID" ] || kill "$KPID" 2>/dev/null || true
    # --one-file-system: never descend into a mount left inside the package tree
    # (mmdebstrap mounts /proc, /sys, /dev there while it runs and unmounts them itself)
    if [ -n "$KEEP_TMP" ]; then echo "[image] kept $TMP $WORK" >&2; else rm -rf --one-file-system "$TMP" "$WORK"; fi
    [ $rc -eq 0 ] || echo "[image] build FAILED (rc $rc); $OUT left as it was" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM
NEW=$TMP/image
mkdir -p "$NEW"

# Debian sources: the host's bookworm suites (whatever mirror the host uses), as
# one-line entries for mmdebstrap. Third-party repositories are left out.
mapfile -t MIRRORS < <(apt-get indextargets --format '$(TARGET_OF) $(REPO_URI) $(RELEASE) $(COMPONENT)' \
    'Identifier: Packages' 2>/dev/null | awk '$1=="deb" && $3 ~ /^bookworm(-updates|-security)?$/ && $4=="main" {print $2, $3}' | sort -u |
    while read -r uri suite; do
        kr=/usr/share/keyrings/debian-archive-keyring.gpg
        if [ -f "$kr" ]; then echo "deb [signed-by=$kr] ${uri%/} $suite main"; else echo "deb ${uri%/} $suite main"; fi
    done)
[ ${#MIRRORS[@]} -gt 0 ] || die "no Debian bookworm source in the host's /etc/apt/sources.list(.d) (the host must be Debian 12: the kernel comes from its apt lists too)"

# ---- kernel + initramfs (runs in the background while mmdebstrap works)
# modules the initramfs loads (with their dependencies, in dependency order)
INITRD_MODULES="virtio_mmio virtio_blk virtio_net virtio_console virtio_rng virtio_balloon"
# The kernel part (vmlinux, bzImage, the initramfs's modules, a variant's module tree
# for the rootfs) is cached per kernel package version: unpacking the .deb (xz) alone
# takes ~4 s.
# One per variant (their module trees differ), so variants sharing a cache keep theirs.
KCACHE=$CACHE_DIR/kcache-$VARIANT-$(printf '%s\n' 2 "$KPKG" "$KVERSION" "$INITRD_MODULES" "$VARIANT_MODULES" | sha256sum | cut -c1-16)
prepare_kernel() {
    local deb kroot kver vmlinuz off magic cmd ok='' line m kc
    [ -s "$KCACHE/load.list" ] && return 0
    deb=$CACHE_DIR/debs/${KPKG}_${KVERSION//:/%3a}_amd64.deb
    if [ ! -s "$deb" ]; then
        log "kernel: apt-get download $KPKG=$KVERSION"
        rm -f "$CACHE_DIR"/debs/linux-image-*.deb
        (cd "$CACHE_DIR/debs" && apt-get download -qq -o APT::Sandbox::User=root "$KPKG=$KVERSION") ||
            { apt-get update -qq && (cd "$CACHE_DIR/debs" && apt-get download -qq -o APT::Sandbox::User=root "$KPKG=$KVERSION"); }
        [ -s "$deb" ] || deb=$(ls "$CACHE_DIR"/debs/"${KPKG}"_*.deb | head -1)
    fi
    log "kernel: unpacking ${deb##*/}"
    kroot=$WORK/kernel
    mkdir -p "$kroot"
    dpkg-deb -x "$deb" "$kroot"
    vmlinuz=$(ls "$kroot"/boot/vmlinuz-*)
    kver=${vmlinuz##*/vmlinuz-}
    kc=$TMP/kcache
    mkdir -p "$kc/modules"
    echo "$kver" >"$kc/kver"

    # vmlinux: the kernel's scripts/extract-vmlinux, reimplemented: find each
    # compression magic in the bzImage, decompress from there, keep the first ELF.
    log "kernel: extracting vmlinux from ${vmlinuz##*/}"
    for magic in '\x02\x21\x4c\x18:lz4 -dc' '\x28\xb5\x2f\xfd:zstd -dcq' '\xfd\x37\x7a\x58\x5a\x00:xz -dcq' \
        '\x1f\x8b\x08:gzip -dcq' 'BZh:bzip2 -dcq' '\x5d\x00\x00\x00:xz -dcq --format=lzma' '\x89\x4c\x5a:lzop -dcq'; do
        cmd=${magic#*:}
        command -v "${cmd%% *}" >/dev/null || continue
        for off in $(grep -obUaP "${magic%%:*}" "$vmlinuz" | cut -d: -f1); do
            tail -c "+$((off + 1))" "$vmlinuz" | $cmd >"$kc/vmlinux" 2>/dev/null || true
            if [ "$(head -c 4 "$kc/vmlinux" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then ok=1; break 2; fi
        done
    done
    [ -n "$ok" ] || { echo "[image] error: cannot extract vmlinux from $vmlinuz" >&2; return 1; }
    # keep the bzImage too: the fallback if a QEMU cannot boot the PVH ELF
    cp "$vmlinuz" "$kc/vmlinuz"

    log "kernel: depmod + module dependencies"
    depmod -b "$kroot" "$kver"
    : >"$kc/load.list.tmp"
    while read -r line; do
        case "$line" in insmod\ *) ;; *) continue ;; esac
        m=$(echo "$line" | awk '{print $2}')
        grep -qx "${m##*/}" "$kc/load.list.tmp" && continue
        cp "$m" "$kc/modules/"
        echo "${m##*/}" >>"$kc/load.list.tmp"
    done < <(modprobe -d "$kroot" -S "$kver" -a --show-depends $INITRD_MODULES)
    [ -z "$VARIANT_MODULES" ] || variant_modules "$kroot" "$kver" "$kc/rootfs" || return 1
    mv "$kc/load.list.tmp" "$kc/load.list"
    rm -rf "$CACHE_DIR"/kcache-"$VARIANT"-* "$CACHE_DIR"/kcache-????????????????
    mv "$kc" "$KCACHE"
    rm -rf "$kroot"
}
# The variant's modules (and what they depend on) as a tree for the rootfs, with its
# own depmod, so that modprobe(8) in the guest finds them by name and alias. Under
# usr/lib/modules: the rootfs has merged /usr (/lib is a link to usr/lib).
variant_modules() {
    local kroot=$1 kver=$2 out=$3 tree=$1/lib/modules/$2 p names cmd path rest
    local -A seen=()
    for p in $VARIANT_MODULES; do
        [ -e "$tree/kernel/$p" ] || { echo "[image] error: $p: not in $KPKG's modules" >&2; return 1; }
    done
    names=$(for p in $VARIANT_MODULES; do find "$tree/kernel/$p" -name '*.ko*' -printf '%f\n'; done |
        sed 's/\.ko.*$//' | sort -u)
    while read -r cmd path rest; do
        [ "$cmd" = insmod ] && seen[${path#"$tree"/}]=1 # kernel/...: the same path in the rootfs
    done < <(modprobe -d "$kroot" -S "$kver" -a --show-depends $names)
    mkdir -p "$out/usr/lib/modules/$kver"
    (cd "$tree" && cp --parents "${!seen[@]}" modules.builtin modules.builtin.modinfo modules.order \
        "$out/usr/lib/modules/$kver/")
    depmod -b "$out/usr" "$kver"
    log "kernel: ${#seen[@]} modules for the rootfs ($(du -sk "$out" | cut -f1) KiB)"
}
build_kernel_initrd() {
    prepare_kernel
    cp "$KCACHE/kver" "$TMP/kver"
    cp "$KCACHE/vmlinux" "$KCACHE/vmlinuz" "$NEW/"
    # initramfs: busybox + modules (dependency order) + /init
    local ir=$WORK/initrd m
    mkdir -p "$ir"/{bin,dev,proc,sys,newroot,lib/modules}
    cp "$KCACHE"/modules/*.ko "$KCACHE/load.list" "$ir/lib/modules/"
    cp "$BUSYBOX" "$ir/bin/busybox"
    for m in $("$BUSYBOX" --list); do [ "$m" = busybox ] || ln -s busybox "$ir/bin/$m"; done
    install -m 0755 "$SRC/init" "$ir/init"
    mknod -m 0600 "$ir/dev/console" c 5 1
    mknod -m 0666 "$ir/dev/null" c 1 3
    find "$ir" -exec touch -h -d @0 {} +
    if [ "$INITRD_COMPRESS" = gzip ]; then
        (cd "$ir" && find . | sort | cpio -o -H newc -R 0:0 --reproducible --quiet | gzip -9n) >"$NEW/initrd.img"
    else
        (cd "$ir" && find . | sort | cpio -o -H newc -R 0:0 --reproducible --quiet) >"$NEW/initrd.img"
    fi
    log "initrd: busybox + $(wc -l <"$ir/lib/modules/load.list") modules: $(tr '\n' ' ' <"$ir/lib/modules/load.list")"
}
build_kernel_initrd >"$TMP/kernel.log" 2>&1 &
KPID=$!

# ---- root filesystem tree: cached per (package list, sources, mmdebstrap options)
ROOT=$WORK/rootfs
MM_OPTS=(--variant=apt --mode=root --format=directory
    --aptopt='Acquire::Languages "none"' --aptopt='APT::Install-Recommends "false"'
    # merged /usr the debootstrap way (symlinks + usr-is-merged), not through the
    # usrmerge package, which drags in perl (~50 MB)
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    # no fsync per file while building (the image is written once, by mke2fs, at the end);
    # the option is removed again so the guest's own dpkg runs keep the default
    --dpkgopt=force-unsafe-io
    --customize-hook='sed -i "/^force-unsafe-io$/d" "$1"/etc/dpkg/dpkg.cfg.d/99mmdebstrap'
    # docs, man pages, locales: deleted afterwards rather than with dpkg path-exclude
    # options, which make mmdebstrap's extract step ~9 s slower; the exclude file is
    # then installed so packages the guest installs later stay small too
    --customize-hook='cd "$1"/usr/share && rm -rf man info lintian linda &&
        find doc -mindepth 1 ! -type d ! -name copyright -delete && find doc -mindepth 1 -type d -empty -delete &&
        find locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +'
    --customize-hook='printf "%s\n" "path-exclude=/usr/share/man/*" "path-exclude=/usr/share/info/*" \
        "path-exclude=/usr/share/locale/*" "path-include=/usr/share/locale/locale.alias" \
        "path-exclude=/usr/share/doc/*" "path-include=/usr/share/doc/*/copyright" \
        "path-exclude=/usr/share/lintian/*" >"$1"/etc/dpkg/dpkg.cfg.d/sbx-nodoc'
    --customize-hook='rm -rf "$1"/var/log/*.log "$1"/var/log/apt/* "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old')
# the cached tree is keyed by everything above (options and hooks included), the
# package list and the sources
BASE_KEY=$(printf '%s\n' 1 "$PACKAGES" "${MIRRORS[@]}" "${MM_OPTS[@]}" | sha256sum | cut -c1-24)
BASE_TAR=$CACHE_DIR/rootfs-base-$BASE_KEY.tar
if [ -n "$NO_CACHE" ]; then rm -f "$CACHE_DIR"/rootfs-base-*.tar; fi
if [ -s "$BASE_TAR" ]; then
    log "rootfs: unpacking cached package tree (${BASE_TAR##*/})"
    mkdir -p "$ROOT"
    tar -C "$ROOT" --numeric-owner --xattrs --xattrs-include='*' -xpf "$BASE_TAR"
else
    log "rootfs: mmdebstrap bookworm ($(wc -w <<<"$PACKAGES") packages + Essential + apt), log in $TMP/mmdebstrap.log"
    # .debs: archives/ keeps the default image's, archives-NAME/ a variant's that the
    # default's lack. A variant's build reads both: with a cache the default image was
    # built with, it downloads only its own extra packages.
    ARCHIVES=$CACHE_DIR/archives
    [ "$VARIANT" = default ] || ARCHIVES+=-$VARIANT
    mkdir -p "$CACHE_DIR/archives" "$ARCHIVES"
    SYNC_IN=(--setup-hook="sync-in $ARCHIVES /var/cache/apt/archives/")
    [ "$VARIANT" = default ] || SYNC_IN+=(--setup-hook="sync-in $CACHE_DIR/archives /var/cache/apt/archives/")
    if ! mmdebstrap "${MM_OPTS[@]}" --include="$PACKAGES" \
        --skip=essential/unlink \
        --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
        "${SYNC_IN[@]}" \
        `# keep exactly the .debs this build used, so the cache does not grow forever` \
        --customize-hook="rm -f '$ARCHIVES'/*.deb" \
        --customize-hook="sync-out /var/cache/apt/archives $ARCHIVES" \
        bookworm "$ROOT" "${MIRRORS[@]}" 2>&1 | stamp >"$TMP/mmdebstrap.log"; then
        tail -30 "$TMP/mmdebstrap.log" >&2
        die "mmdebstrap failed"
    fi
    if [ "$VARIANT" != default ]; then
        for deb in "$ARCHIVES"/*.deb; do
            [ ! -e "$CACHE_DIR/archives/${deb##*/}" ] || rm -f "$deb"
        done
    fi
    log "rootfs: caching package tree"
    tar -C "$ROOT" --numeric-owner --xattrs --xattrs-include='*' -cf "$BASE_TAR.tmp" . && mv "$BASE_TAR.tmp" "$BASE_TAR"
    # keep the three most recent package trees (e.g. the default's and a variant's)
    ls -t "$CACHE_DIR"/rootfs-base-*.tar | tail -n +4 | xargs -r rm -f
fi

# ---- sbx files in the tree
log "rootfs: installing sbx-init${AGENT:+ and sbx-agent}"
install -m 0755 "$SRC/sbx-init" "$ROOT/usr/sbin/sbx-init"
[ -z "$AGENT" ] || install -m 0755 "$AGENT" "$ROOT/usr/sbin/sbx-agent"
echo sbx >"$ROOT/etc/hostname"
echo "nameserver 10.0.2.3" >"$ROOT/etc/resolv.conf"
printf '# / is /dev/vda, mounted by the initramfs\n/dev/vda / ext4 rw,noatime 0 1\n' >"$ROOT/etc/fstab"
: >"$ROOT/etc/machine-id"
mkdir -p "$ROOT/etc/sbx"
printf '%s\n' "$INPUT_HASH" >"$ROOT/etc/sbx/image-hash"

# ---- wait for the kernel part
if ! wait "$KPID"; then KPID=''; cat "$TMP/kernel.log" >&2; die "kernel/initrd step failed"; fi
KPID=''
sed 's/^/  /' "$TMP/kernel.log"
KVER=$(cat "$TMP/kver")
ROOTFS_MODULES=0
if [ -n "$VARIANT_MODULES" ]; then
    [ -L "$ROOT/lib" ] || die "the rootfs has no merged /usr (/lib is not a link): the module tree has no place"
    cp -a "$KCACHE/rootfs/." "$ROOT/"
    ROOTFS_MODULES=$(find "$ROOT/usr/lib/modules/$KVER" -name '*.ko*' | wc -l)
fi

# ---- ext4 image
CONTENT_KIB=$(du -sk "$ROOT" | cut -f1)
INODES=$(find "$ROOT" -xdev | wc -l)
# content + 10% (ext4 metadata, journal) + the requested free space, rounded to 64 MiB
SIZE_MIB=$(( (CONTENT_KIB * 11 / 10 / 1024 + FREE_MIB + 63) / 64 * 64 ))
log "rootfs: mke2fs -d ($((CONTENT_KIB / 1024)) MiB in $INODES files -> ${SIZE_MIB} MiB image)"
truncate -s "${SIZE_MIB}M" "$NEW/rootfs.ext4"
mke2fs -q -F -t ext4 -L sbx-root -m 0 -b 4096 -I 256 \
    -E lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0 \
    -d "$ROOT" "$NEW/rootfs.ext4"
chmod 0444 "$NEW/rootfs.ext4"

# ---- manifest
PKG_JSON=$(dpkg-query --admindir="$ROOT/var/lib/dpkg" -W -f '${db:Status-Abbrev}|${Package}|${Version}\n' |
    awk -F'|' '$1 ~ /^ii/ {printf "%s\n    {\"name\": \"%s\", \"version\": \"%s\"}", sep, $2, $3; sep=","}')
MOD_JSON=$(awk '{printf "%s\"%s\"", sep, $1; sep=", "}' "$WORK/initrd/lib/modules/load.list")
size() { stat -c %s "$1"; }
alloc() { echo $(( $(stat -c %b "$1") * $(stat -c %B "$1") )); }
json_str() { local s=$1; s=${s//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
BUILD_SECONDS=$(printf '%.1f' "$(elapsed)")
{
    echo "{"
    echo "  \"format\": 1,"
    echo "  \"input_hash\": \"$INPUT_HASH\","
    echo "  \"variant\": \"$VARIANT\","
    echo "  \"built_at\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
    echo "  \"build_seconds\": $BUILD_SECONDS,"
    echo "  \"kernel\": {\"package\": \"$KPKG\", \"version\": \"$KVERSION\", \"release\": \"$KVER\", \"boot\": \"vmlinux (ELF, PVH entry); vmlinuz is the bzImage fallback\"},"
    echo "  \"cmdline\": \"console=ttyS0 quiet tsc=reliable no_timer_check cryptomgr.notests tsc_early_khz=<host TSC kHz> root=/dev/vda rw panic=-1 sbx.hostname=<name>\","
    echo "  \"initrd\": {\"compression\": \"$INITRD_COMPRESS\", \"modules\": [$MOD_JSON]},"
    echo "  \"rootfs\": {\"size_mib\": $SIZE_MIB, \"content_kib\": $CONTENT_KIB, \"files\": $INODES, \"free_mib_requested\": $FREE_MIB, \"kernel_modules\": $ROOTFS_MODULES},"
    echo "  \"agent\": $( [ -z "$AGENT" ] && echo null || echo "{\"source\": $(json_str "$AGENT"), \"sha256\": \"$AGENT_SHA\"}"),"
    echo "  \"packages_requested\": [$(printf '"%s", ' $PACKAGES | sed 's/, $//')],"
    echo "  \"sources\": [$(for m in "${MIRRORS[@]}"; do printf '%s, ' "$(json_str "$m")"; done | sed 's/, $//')],"
    echo "  \"sizes\": {"
    echo "    \"vmlinux\": $(size "$NEW/vmlinux"),"
    echo "    \"vmlinuz\": $(size "$NEW/vmlinuz"),"
    echo "    \"initrd.img\": $(size "$NEW/initrd.img"),"
    echo "    \"rootfs.ext4\": $(size "$NEW/rootfs.ext4"),"
    echo "    \"rootfs.ext4_allocated\": $(alloc "$NEW/rootfs.ext4")"
    echo "  },"
    echo "  \"packages\": [$PKG_JSON"
    echo "  ]"
    echo "}"
} >"$NEW/manifest.json.tmp"
mv "$NEW/manifest.json.tmp" "$NEW/manifest.json"

# ---- into place: the old directory is moved aside first, so OUT is either the old
# complete image, absent for an instant, or the new complete image.
OLD=$TMP/old
mv "$OUT" "$OLD"
mv "$NEW" "$OUT"

log "done in ${BUILD_SECONDS}s:"
for f in vmlinux initrd.img rootfs.ext4 manifest.json; do
    printf '[image]          %-14s %8.1f MiB' "$f" "$(awk -v s="$(size "$OUT/$f")" 'BEGIN{print s/1048576}')"
    [ "$f" = rootfs.ext4 ] && printf ' (%.1f MiB allocated)' "$(awk -v s="$(alloc "$OUT/$f")" 'BEGIN{print s/1048576}')"
    echo
done
log "total build time ${BUILD_SECONDS}s"
