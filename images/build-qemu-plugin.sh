#!/bin/sh
# build-qemu-plugin.sh [--cache DIR] [--qemu PATH]
#
# Build images/qemu-plugin/blklab-insns.c, blklab's TCG plugin counting
# executed guest instructions (kernel/user per vCPU, per kernel translation
# block), for the installed QEMU, check that this QEMU loads it, and print the
# plugin's path on stdout (progress goes to stderr).
#
# Debian ships neither qemu-plugin.h nor plugins. The header comes from the
# installed QEMU's own source package: `apt-get source --download-only qemu`
# at the source version of the installed qemu-system-x86 (a deb-src entry is
# added when apt has none, as build-fio.sh does), and only
# include/qemu/qemu-plugin.h is taken from the upstream tarball (Debian's
# patches do not touch it). Then gcc -shared -fPIC with glib.
#
# Cache: --cache DIR, else $BLKLAB_IMAGE_CACHE, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images; the plugin goes to
# DIR/qemu-plugin-HASH/libblklab-insns.so, HASH over the QEMU package
# version, this script, the plugin source, gcc's and glib's versions. A
# repeated call is a cache hit and prints the same path.
#
# Exit status non-zero with a last line `build-qemu-plugin: ERROR: …` naming
# the fix on any failure.
set -eu

log() { echo "build-qemu-plugin: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { echo "usage: $0 [--cache DIR] [--qemu PATH]" >&2; exit 2; }

CACHE=""
QEMU=qemu-system-x86_64
while [ $# -gt 0 ]; do
    case "$1" in
    --cache) [ $# -ge 2 ] || usage; CACHE=$2; shift 2 ;;
    --cache=*) CACHE=${1#*=}; shift ;;
    --qemu) [ $# -ge 2 ] || usage; QEMU=$2; shift 2 ;;
    --qemu=*) QEMU=${1#*=}; shift ;;
    -h|--help) usage ;;
    *) log "ERROR: unknown argument: $1"; usage ;;
    esac
done
[ -n "$CACHE" ] || CACHE=${BLKLAB_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images}
PATH=$PATH:/usr/sbin:/sbin
export PATH

HERE=$(cd "$(dirname "$0")" && pwd)
SELF="$HERE/$(basename "$0")"
SRC_C="$HERE/qemu-plugin/blklab-insns.c"
[ -f "$SRC_C" ] || die "$SRC_C is missing"
sha256() { sha256sum "$1" | cut -d' ' -f1; }
command -v "$QEMU" >/dev/null 2>&1 || die "$QEMU not found: apt-get install qemu-system-x86"
for tool in apt-get apt-cache dpkg-query sha256sum tar; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (this needs a Debian/apt system)"
done

# --- build dependencies ---------------------------------------------------------------
BUILD_DEPS="gcc libc6-dev libglib2.0-dev pkg-config dpkg-dev xz-utils"
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
missing=""
for p in $BUILD_DEPS; do
    installed "$p" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    [ "$(id -u)" -eq 0 ] || die "missing build dependencies; run as root: apt-get install --no-install-recommends$missing"
    log "installing build dependencies:$missing"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null; then
        apt-get update -qq >&2 || die "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null \
            || die "apt-get install$missing failed"
    fi
fi

# --- which QEMU -------------------------------------------------------------------------
QPKG=$(dpkg-query -S "$(readlink -f "$(command -v "$QEMU")")" 2>/dev/null | head -n1 | cut -d: -f1 || true)
[ -n "$QPKG" ] || QPKG=qemu-system-x86
QBINVER=$(dpkg-query -W -f='${Version}' "$QPKG" 2>/dev/null) \
    || die "$QEMU is not from a Debian package; build the plugin against its own source tree's include/qemu/qemu-plugin.h"
QSRCVER=$(dpkg-query -W -f='${source:Version}' "$QPKG")
QVERSION=$("$QEMU" --version | head -n1)

pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }
inputs() {
    echo "format 1"
    echo "qemu $QPKG $QBINVER $QVERSION"
    echo "script $(sha256 "$SELF")"
    echo "source $(sha256 "$SRC_C")"
    for p in gcc libglib2.0-dev libc6-dev; do echo "dep $p $(pkgver "$p")"; done
}
HASH=$(inputs | sha256sum | cut -c1-16)
OUT="$CACHE/qemu-plugin-$HASH"
SO="$OUT/libblklab-insns.so"
if [ -f "$SO" ] && [ -f "$OUT/inputs" ] && [ "$(sha256 "$SO")" = "$(cat "$OUT/so.sha256" 2>/dev/null)" ]; then
    log "cached: $SO"
    echo "$SO"
    exit 0
fi

# --- the header: from the installed QEMU's source package ---------------------------------
HDR_DIR="$CACHE/qemu-plugin-header-$(echo "$QSRCVER" | tr ':+~' '___')"
HDR="$HDR_DIR/qemu-plugin.h"
if [ ! -f "$HDR" ]; then
    if [ -z "$(apt-cache showsrc qemu 2>/dev/null | sed -n 's/^Version: *//p')" ]; then
        DEBSRC=/etc/apt/sources.list.d/blklab-deb-src.sources
        if [ ! -f "$DEBSRC" ]; then
            [ "$(id -u)" -eq 0 ] || die "apt has no deb-src entry for qemu; as root, add one (see $SELF)"
            log "adding a deb-src entry: $DEBSRC"
            cat > "$DEBSRC" <<'EOF'
# Added by blklab images/build-qemu-plugin.sh: source packages (apt-get source qemu).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        fi
        log "running apt-get update (source lists)"
        apt-get update -qq >&2 || die "apt-get update failed (check the network and $DEBSRC)"
    fi
    WANT=$QSRCVER
    if ! apt-cache showsrc qemu 2>/dev/null | grep -qx "Version: $QSRCVER"; then
        WANT=$(apt-cache showsrc qemu 2>/dev/null | sed -n 's/^Version: *//p' | sort -V | tail -n1)
        [ -n "$WANT" ] || die "apt-cache showsrc qemu finds nothing; check the deb-src entries"
        # Same upstream version => same plugin API.
        [ "${WANT%-*}" = "${QSRCVER%-*}" ] \
            || die "the installed QEMU's source $QSRCVER is not in apt and the available $WANT is another upstream version; apt-get update, or install qemu-system-x86=$WANT"
        log "source $QSRCVER is gone from apt; using $WANT (same upstream version)"
    fi
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/blklab-qemu-src.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    chmod 755 "$WORK"   # apt-get may drop privileges to _apt
    log "apt-get source --download-only qemu=$WANT (for include/qemu/qemu-plugin.h)"
    # Only the upstream tarball is needed. Backports' .dsc and
    # .debian.tar can be missing from a mirror while the .orig.tar (shared
    # with the release it was backported from) is there: that is enough.
    if ! (cd "$WORK" && apt-get source --download-only -q "qemu=$WANT" >"$WORK/source.log" 2>&1); then
        if ls "$WORK"/qemu_*.orig.tar.* >/dev/null 2>&1; then
            log "apt-get source qemu=$WANT fetched the upstream tarball but not all of the package (using the tarball)"
        else
            cat "$WORK/source.log" >&2
            die "apt-get source qemu=$WANT failed (apt-get install dpkg-dev; apt-get update)"
        fi
    fi
    ORIG=$(ls "$WORK"/qemu_*.orig.tar.* 2>/dev/null | head -n1)
    [ -n "$ORIG" ] || die "apt-get source left no qemu_*.orig.tar.* in $WORK"
    (cd "$WORK" && tar -xf "$ORIG" --wildcards '*/include/qemu/qemu-plugin.h') \
        || die "$ORIG has no include/qemu/qemu-plugin.h"
    FOUND=$(find "$WORK" -path '*/include/qemu/qemu-plugin.h' | head -n1)
    [ -n "$FOUND" ] || die "no include/qemu/qemu-plugin.h in $ORIG"
    mkdir -p "$HDR_DIR"
    cp "$FOUND" "$HDR.tmp" && mv "$HDR.tmp" "$HDR"
    echo "$WANT" > "$HDR_DIR/source-version"
fi
API=$(sed -n 's/^#define QEMU_PLUGIN_VERSION \([0-9]*\).*/\1/p' "$HDR")
log "plugin API version ${API:-?} ($HDR)"

# --- build and check --------------------------------------------------------------------
mkdir -p "$OUT"
CFLAGS=$(pkg-config --cflags glib-2.0) || die "pkg-config finds no glib-2.0 (apt-get install libglib2.0-dev)"
# shellcheck disable=SC2086
gcc -O2 -Wall -Wextra -Wno-unused-parameter -Werror -shared -fPIC -std=gnu11 \
    -I"$HDR_DIR" $CFLAGS -o "$SO.tmp" "$SRC_C" -lpthread 2>"$OUT/gcc.log" \
    || { cat "$OUT/gcc.log" >&2; die "gcc failed to build the plugin (see above)"; }
mv "$SO.tmp" "$SO"
# The installed QEMU must load it: a machine without CPUs, quit at once.
if ! LOAD=$(echo quit | "$QEMU" -accel tcg -machine none -display none -nodefaults \
        -monitor stdio -plugin "$SO" 2>&1); then
    rm -f "$SO"
    die "$QEMU does not load the plugin: $LOAD"
fi
sha256 "$SO" > "$OUT/so.sha256"
inputs > "$OUT/inputs"
log "built $SO"
echo "$SO"
