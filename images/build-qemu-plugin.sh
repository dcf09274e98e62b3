#!/bin/sh
# build-qemu-plugin.sh [--cache DIR] [--qemu PATH]
#
# Build images/qemu-plugin/blklab-insns.c, blklab's TCG plugin counting
# executed guest instructions (kernel/user per vCPU, per kernel translation
# block; the machine's own code and what it runs as an SVM guest apart),
# for the installed QEMU, check that this QEMU loads it, and print the
# plugin's path on stdout (progress goes to stderr).
#
# Debian ships neither qemu-plugin.h nor plugins. The header comes from the
# installed QEMU's own source package: `apt-get source --download-only qemu`
# at the source version of the installed qemu-system-x86 (a deb-src entry is
# added when apt has none, as build-fio.sh does: images/lib.sh), and only
# include/qemu/qemu-plugin.h is taken from the upstream tarball (Debian's
# patches do not touch it). Then gcc -shared -fPIC with glib.
#
# Cache: --cache DIR, else $BLKLAB_IMAGE_CACHE, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images; the plugin goes to
# DIR/qemu-plugin-HASH/libblklab-insns.so (+ manifest.json), HASH the first
# 16 hex digits of the key: the installed QEMU's package, version and
# --version (read locally), this script and images/lib.sh, the plugin
# source and its decoder header (gcc's and glib's versions are pinned in the manifest, not keyed).
# A repeated call is a cache hit (no apt, no compiler) and prints the same
# path. --key prints the key and the directory's name as JSON.
#
# Exit status non-zero with a last line `build-qemu-plugin: ERROR: …` naming
# the fix on any failure.
set -eu

LOG_NAME=build-qemu-plugin
USAGE="$0 [--cache DIR] [--qemu PATH] [--key]
  --key: print the plugin's key and its directory's name in the cache, build nothing"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"

CACHE=""
QEMU=qemu-system-x86_64
KEY_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
    --cache|--cache=*) opt_value "$@"; CACHE=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --key) KEY_ONLY=1; shift ;;
    --qemu|--qemu=*) opt_value "$@"; QEMU=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    -h|--help) usage ;;
    *) unknown_arg "$1" ;;
    esac
done
[ -n "$CACHE" ] || CACHE=$(image_cache)

SRC_C="$HERE/qemu-plugin/blklab-insns.c"
SRC_H="$HERE/qemu-plugin/blklab-decode.h"
[ -f "$SRC_C" ] || die "$SRC_C is missing"
[ -f "$SRC_H" ] || die "$SRC_H is missing"
command -v "$QEMU" >/dev/null 2>&1 || die "$QEMU not found: apt-get install qemu-system-x86"
need_tools "this needs a Debian system" dpkg-query sha256sum

# --- which QEMU (local: the dpkg database and qemu --version) ------------------------------
QPKG=$(dpkg-query -S "$(readlink -f "$(command -v "$QEMU")")" 2>/dev/null | head -n1 | cut -d: -f1 || true)
[ -n "$QPKG" ] || QPKG=qemu-system-x86
QBINVER=$(dpkg-query -W -f='${Version}' "$QPKG" 2>/dev/null) \
    || die "$QEMU is not from a Debian package; build the plugin against its own source tree's include/qemu/qemu-plugin.h"
QSRCVER=$(dpkg-query -W -f='${source:Version}' "$QPKG")
QVERSION=$("$QEMU" --version | head -n1)

# The key: the installed QEMU (package, version, --version), this script
# and lib.sh, the plugin's source. Not the compiler's or glib's versions
# (pinned in the manifest): a plugin imported for the same QEMU is a hit on
# a machine without gcc.
inputs() {
    echo "blklab-key qemu-plugin 2"
    echo "qemu $QPKG $QBINVER $QVERSION"
    code_inputs
    echo "source $(sha256 "$SRC_C")"
    echo "decoder $(sha256 "$SRC_H")"
}
HASH=$(inputs | sha256)
OUT="$CACHE/qemu-plugin-$(echo "$HASH" | cut -c1-16)"
SO="$OUT/libblklab-insns.so"
if [ "$KEY_ONLY" = 1 ]; then
    printf '{"key":"%s","dir":"%s","qemu":"%s"}
' "$HASH" "$(basename "$OUT")" "$(jstr "$QPKG $QBINVER")"
    exit 0
fi
if output_matches "$OUT" libblklab-insns.so sha256 "$HASH"; then
    log "cached: $SO"
    echo "$SO"
    exit 0
fi
need_tools "this needs a Debian/apt system" apt-get apt-cache tar

# --- build dependencies ---------------------------------------------------------------
install_build_deps gcc libc6-dev libglib2.0-dev pkg-config dpkg-dev xz-utils

# --- the header: from the installed QEMU's source package ---------------------------------
HDR_DIR="$CACHE/qemu-plugin-header-$(echo "$QSRCVER" | tr ':+~' '___')"
HDR="$HDR_DIR/qemu-plugin.h"
if [ ! -f "$HDR" ]; then
    ensure_deb_src qemu
    WANT=$QSRCVER
    if ! apt-cache showsrc qemu 2>/dev/null | grep -qx "Version: $QSRCVER"; then
        WANT=$(src_version qemu)
        [ -n "$WANT" ] || die "apt-cache showsrc qemu finds nothing; check the deb-src entries"
        # Same upstream version => same plugin API.
        [ "${WANT%-*}" = "${QSRCVER%-*}" ] \
            || die "the installed QEMU's source $QSRCVER is not in apt and the available $WANT is another upstream version; apt-get update, or install qemu-system-x86=$WANT"
        log "source $QSRCVER is gone from apt; using $WANT (same upstream version)"
    fi
    apt_work qemu-src
    log "apt-get source --download-only qemu=$WANT (for include/qemu/qemu-plugin.h)"
    # Only the upstream tarball is needed. Backports' .dsc and
    # .debian.tar can be missing from a mirror while the .orig.tar (shared
    # with the release it was backported from) is there: that is enough.
    if ! (cd "$WORK" && apt-get source --download-only -q "qemu=$WANT" >"$WORK/source.log" 2>&1); then
        if [ -n "$(first "$WORK"/qemu_*.orig.tar.*)" ]; then
            log "apt-get source qemu=$WANT fetched the upstream tarball but not all of the package (using the tarball)"
        else
            cat "$WORK/source.log" >&2
            die "apt-get source qemu=$WANT failed (apt-get install dpkg-dev; apt-get update)"
        fi
    fi
    ORIG=$(first "$WORK"/qemu_*.orig.tar.*)
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
# shellcheck disable=SC2086  # CFLAGS: pkg-config's flags, split on purpose
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
inputs > "$OUT/inputs"
cat > "$OUT/manifest.json.tmp" <<EOF
{
  "kind": "qemu-plugin",
  "qemu_package": "$QPKG",
  "qemu_package_version": "$(jstr "$QBINVER")",
  "qemu_version": "$(jstr "$QVERSION")",
  "plugin_api": "${API:-unknown}",
  "header_source_version": "$(jstr "$(cat "$HDR_DIR/source-version" 2>/dev/null || echo "$QSRCVER")")",
  "built_with": [$(dep_versions gcc libglib2.0-dev libc6-dev | cut -d' ' -f2- | sed 's/ /=/' | json_list)],
  "sha256": "$(sha256 "$SO")",
  "inputs_hash": "$HASH",
  "built_at": "$(utc_now)"
}
EOF
mv "$OUT/manifest.json.tmp" "$OUT/manifest.json"
log "built $SO"
echo "$SO"
