#!/bin/sh
# build-fio.sh --out DIR
#
# Build a small fio for the guest from Debian's own source package
# (`apt-get source fio`, Debian's patches applied), configured without the
# engines that pull in big libraries (ceph rbd/rados, gluster gfapi, http,
# libnfs, rdma, pmem, numa, ...), so that it links only libaio, zlib, libm and
# libc. The libaio and io_uring engines stay (fio's io_uring engine uses the
# kernel's interface directly and needs no liburing). `--disable-native`: the
# binary runs on QEMU's virtual CPUs, not only on this host's.
#
#   DIR/fio             (stripped)
#   DIR/manifest.json   (fio version, source package + version, configure
#                        arguments, engines checked, libraries, sha256)
#
# Needs a deb-src entry: when `apt-cache showsrc fio` finds nothing, this adds
# /etc/apt/sources.list.d/blklab-deb-src.sources (bookworm and
# bookworm-updates main; images/lib.sh) and runs `apt-get update`. Missing
# build dependencies (gcc make pkg-config libaio-dev zlib1g-dev dpkg-dev) are
# installed with apt-get when running as root.
#
# Cached: when DIR/manifest.json records the same key (this script and
# images/lib.sh; the source version and the compiler and library versions
# are pinned in the manifest, not keyed) and the sha256 of DIR/fio matches,
# nothing is done ("cached"): no apt, no compiler.
set -eu

LOG_NAME=build-fio
USAGE="$0 --out DIR"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"

OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
    --out|--out=*) opt_value "$@"; OUT=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    -h|--help) usage ;;
    *) unknown_arg "$1" ;;
    esac
done
[ -n "$OUT" ] || usage

# --- the key / cache (before anything that needs apt or a compiler) ------------------
# The key is this script and lib.sh (images/lib.sh, key_fio); the source
# version and the compiler and library versions are pinned in the manifest.
HASH=$(key_fio)
if [ -x "$OUT/fio" ] && output_matches "$OUT" fio sha256 "$HASH"; then
    log "cached: $OUT/fio ($(json_field "$OUT/manifest.json" version), fio $(json_field "$OUT/manifest.json" source_version))"
    exit 0
fi
refuse_foreign "$OUT" fio "choose another --out"
need_tools "this needs a Debian/apt system" apt-get apt-cache dpkg-query sha256sum ldd

# --- build dependencies -------------------------------------------------------------
install_build_deps gcc make pkg-config libaio-dev zlib1g-dev dpkg-dev binutils

# --- source package version (needs deb-src) -------------------------------------------
ensure_deb_src fio
SRCVER=$(src_version fio)
[ -n "$SRCVER" ] || die "apt-cache showsrc fio finds nothing even with $DEBSRC; check /etc/apt/sources.list.d"

# --- fetch and unpack ----------------------------------------------------------------------------
T0=$(date +%s)
apt_work fio
log "apt-get source fio=$SRCVER"
if ! (cd "$WORK" && apt-get source -q "fio=$SRCVER" >"$WORK/source.log" 2>&1); then
    cat "$WORK/source.log" >&2
    die "apt-get source fio=$SRCVER failed (apt-get install dpkg-dev; and apt-get update if the version is gone)"
fi
SRC=$(first "$WORK"/fio-*/)
{ [ -n "$SRC" ] && [ -x "$SRC/configure" ]; } || die "apt-get source fio left no fio-*/configure in $WORK"
SRC=${SRC%/}

# --- configure --------------------------------------------------------------------------------------
# Every switch that turns off an optional engine or library; only the ones
# this fio's configure knows are passed.
WANT="--disable-native --disable-numa --disable-rdma --disable-rados --disable-rbd --disable-http
      --disable-gfapi --disable-libnfs --disable-pmem --disable-xnvme --disable-libzbc
      --disable-tcmalloc --disable-dfs --disable-lex"
HELP=$(cd "$SRC" && ./configure --help 2>&1) || true
ARGS=""
for a in $WANT; do
    if printf '%s\n' "$HELP" | grep -q -- "^$a\([ =]\|$\)"; then
        ARGS="$ARGS $a"
    else
        log "configure has no $a; skipped"
    fi
done
ARGS="--prefix=/usr$ARGS"
log "./configure $ARGS"
# shellcheck disable=SC2086  # ARGS: the configure switches, split on purpose
if ! (cd "$SRC" && ./configure $ARGS >"$WORK/configure.log" 2>&1); then
    tail -n 30 "$WORK/configure.log" >&2
    die "fio's configure failed (see above)"
fi
for want in "Linux AIO support.*yes" "zlib.*yes"; do
    grep -q "$want" "$WORK/configure.log" || {
        grep -i -e aio -e zlib "$WORK/configure.log" >&2 || true
        die "fio's configure did not find ${want%%.*} (apt-get install libaio-dev zlib1g-dev)"
    }
done

# --- build ----------------------------------------------------------------------------------------------
JOBS=$(nproc 2>/dev/null || echo 2)
log "make -j$JOBS fio"
M0=$(date +%s)
if ! (cd "$SRC" && make -j"$JOBS" fio >"$WORK/make.log" 2>&1); then
    tail -n 30 "$WORK/make.log" >&2
    die "building fio failed (see above)"
fi
MAKE_SECS=$(( $(date +%s) - M0 ))
BIN="$SRC/fio"
[ -x "$BIN" ] || die "make fio produced no fio binary"
strip "$BIN" || die "strip $BIN failed (apt-get install binutils)"

# --- checks ------------------------------------------------------------------------------------------
VERSION=$("$BIN" --version 2>/dev/null) || die "the new fio does not run (--version)"
ENGINES=$("$BIN" --enghelp 2>/dev/null) || die "the new fio does not run (--enghelp)"
for e in libaio io_uring psync; do
    printf '%s\n' "$ENGINES" | grep -qx "[[:space:]]*$e" || die "the new fio has no $e engine (fio --enghelp)"
done
LIBS=$(ldd_names "$BIN")
bad=""
for l in $LIBS; do
    case "$l" in
    linux-vdso.so.*|ld-linux-x86-64.so.*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libaio.so.*|libz.so.*|liburing.so.*) ;;
    *) bad="$bad $l" ;;
    esac
done
[ -z "$bad" ] || die "the new fio links unexpected libraries:$bad (add the matching --disable-* switch to build-fio.sh)"

# --- output ----------------------------------------------------------------------------------------------
mkdir -p "$OUT"
cp "$BIN" "$OUT/fio.tmp"
mv "$OUT/fio.tmp" "$OUT/fio"
SHA=$(sha256 "$OUT/fio")
ENG_JSON=$(printf '%s\n' "$ENGINES" | sed -n 's/^[[:space:]]\{1,\}\([A-Za-z0-9_.-]*\)$/\1/p' | json_list)
LIB_JSON=$(printf '%s\n' "$LIBS" | json_list)
ARGS_JSON=$(printf '%s\n' "$ARGS" | json_list)
cat > "$OUT/manifest.json.tmp" <<EOF
{
  "kind": "fio",
  "version": "$VERSION",
  "source_package": "fio",
  "source_version": "$SRCVER",
  "built_with": [$(dep_versions gcc libaio-dev zlib1g-dev libc6-dev | cut -d' ' -f2- | sed 's/ /=/' | json_list)],
  "configure_args": [$ARGS_JSON],
  "engines": [$ENG_JSON],
  "libraries": [$LIB_JSON],
  "size": $(wc -c < "$OUT/fio"),
  "sha256": "$SHA",
  "inputs_hash": "$HASH",
  "built_at": "$(utc_now)",
  "make_seconds": $MAKE_SECS,
  "build_seconds": $(( $(date +%s) - T0 ))
}
EOF
mv "$OUT/manifest.json.tmp" "$OUT/manifest.json"
log "done: $OUT/fio ($VERSION, $(du -h "$OUT/fio" | cut -f1), links:$(printf '%s\n' "$LIBS" | awk '{printf " %s", $0}'); $(( $(date +%s) - T0 ))s)"
