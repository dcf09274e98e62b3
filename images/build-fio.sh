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
# /etc/apt/sources.list.d/blklab-deb-src.sources (bookworm main) and runs
# `apt-get update`. Missing build dependencies (gcc make pkg-config libaio-dev
# zlib1g-dev dpkg-dev) are installed with apt-get when running as root.
#
# Cached: when DIR/manifest.json records the same inputs hash (this script,
# the source version, the versions of the compiler and libraries) and the
# sha256 of DIR/fio matches, nothing is done ("cached").
set -eu

log() { echo "build-fio: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { echo "usage: $0 --out DIR" >&2; exit 2; }

OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --out=*) OUT=${1#*=}; shift ;;
    -h|--help) usage ;;
    *) log "ERROR: unknown argument: $1"; usage ;;
    esac
done
[ -n "$OUT" ] || usage
PATH=$PATH:/usr/sbin:/sbin
export PATH

HERE=$(cd "$(dirname "$0")" && pwd)
SELF="$HERE/$(basename "$0")"
sha256() { sha256sum "$1" | cut -d' ' -f1; }
json_field() { sed -n "s/.*\"$2\": *\"\([^\"]*\)\".*/\1/p" "$1" 2>/dev/null | head -n1; }

for tool in apt-get apt-cache dpkg-query sha256sum ldd; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (this needs a Debian/apt system)"
done

# --- build dependencies -------------------------------------------------------------
BUILD_DEPS="gcc make pkg-config libaio-dev zlib1g-dev dpkg-dev binutils"
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
missing=""
for p in $BUILD_DEPS; do
    installed "$p" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        log "installing build dependencies:$missing"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2; then
            log "apt-get install failed; running apt-get update and retrying"
            apt-get update -qq >&2 || die "apt-get update failed"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2 \
                || die "apt-get install$missing failed"
        fi
    else
        die "missing build dependencies; run as root: apt-get install --no-install-recommends$missing"
    fi
fi

# --- source package version (needs deb-src) -------------------------------------------
src_version() {
    apt-cache showsrc fio 2>/dev/null | sed -n 's/^Version: *//p' | sort -V | tail -n1
}
SRCVER=$(src_version)
if [ -z "$SRCVER" ]; then
    DEBSRC=/etc/apt/sources.list.d/blklab-deb-src.sources
    if [ ! -f "$DEBSRC" ]; then
        [ "$(id -u)" -eq 0 ] || die "apt has no deb-src entry for fio; as root, add one (see $SELF) or run this script as root"
        log "adding a deb-src entry: $DEBSRC"
        cat > "$DEBSRC" <<'EOF'
# Added by blklab images/build-fio.sh: source packages (apt-get source fio).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    fi
    log "running apt-get update (source lists)"
    apt-get update -qq >&2 || die "apt-get update failed (check the network and $DEBSRC)"
    SRCVER=$(src_version)
    [ -n "$SRCVER" ] || die "apt-cache showsrc fio finds nothing even with $DEBSRC; check /etc/apt/sources.list.d"
fi

# --- inputs hash / cache ----------------------------------------------------------------------
pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }
inputs() {
    echo "format 1"
    echo "script $(sha256 "$SELF")"
    echo "source fio $SRCVER"
    for p in gcc libaio-dev zlib1g-dev libc6-dev; do echo "dep $p $(pkgver "$p")"; done
}
HASH=$(inputs | sha256sum | cut -d' ' -f1)
if [ -f "$OUT/manifest.json" ] && [ -x "$OUT/fio" ] \
   && [ "$(json_field "$OUT/manifest.json" inputs_hash)" = "$HASH" ] \
   && [ "$(json_field "$OUT/manifest.json" sha256)" = "$(sha256 "$OUT/fio")" ]; then
    log "cached: $OUT/fio ($(json_field "$OUT/manifest.json" version))"
    exit 0
fi
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ] && [ ! -e "$OUT/manifest.json" ] && [ ! -e "$OUT/fio" ]; then
    die "$OUT is not empty and was not made by this script; refusing to overwrite it (choose another --out)"
fi

# --- fetch and unpack ----------------------------------------------------------------------------
T0=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/blklab-fio.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
chmod 755 "$WORK"   # apt-get source may drop privileges to _apt
log "apt-get source fio=$SRCVER"
if ! (cd "$WORK" && apt-get source -q "fio=$SRCVER" >"$WORK/source.log" 2>&1); then
    cat "$WORK/source.log" >&2
    die "apt-get source fio=$SRCVER failed (apt-get install dpkg-dev; and apt-get update if the version is gone)"
fi
SRC=$(ls -d "$WORK"/fio-*/ 2>/dev/null | head -n1)
[ -n "$SRC" ] && [ -x "$SRC/configure" ] || die "apt-get source fio left no fio-*/configure in $WORK"
SRC=${SRC%/}

# --- configure --------------------------------------------------------------------------------------
# Every switch that turns off an optional engine or library; only the ones
# this fio's configure knows are passed.
WANT="--disable-native --disable-numa --disable-rdma --disable-rados --disable-rbd --disable-http
      --disable-gfapi --disable-libnfs --disable-pmem --disable-xnvme --disable-libzbc
      --disable-tcmalloc --disable-dfs --disable-lex"
HELP=$(cd "$SRC" && ./configure --help 2>&1 || true)
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
# shellcheck disable=SC2086
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
LIBS=$(ldd "$BIN" | awk '/=>/ {print $1; next} /^[ \t]*\// {print $1}' | sed 's,.*/,,' | LC_ALL=C sort -u)
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
json_list() { printf '%s\n' "$@" | awk 'NF {printf "%s\"%s\"", (n++ ? ", " : ""), $1}'; }
ENG_JSON=$(json_list $(printf '%s\n' "$ENGINES" | sed -n 's/^[[:space:]]\{1,\}\([A-Za-z0-9_.-]*\)$/\1/p'))
LIB_JSON=$(json_list $LIBS)
ARGS_JSON=$(json_list $ARGS)
cat > "$OUT/manifest.json.tmp" <<EOF
{
  "kind": "fio",
  "version": "$VERSION",
  "source_package": "fio",
  "source_version": "$SRCVER",
  "configure_args": [$ARGS_JSON],
  "engines": [$ENG_JSON],
  "libraries": [$LIB_JSON],
  "size": $(wc -c < "$OUT/fio"),
  "sha256": "$SHA",
  "inputs_hash": "$HASH",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "make_seconds": $MAKE_SECS,
  "build_seconds": $(( $(date +%s) - T0 ))
}
EOF
mv "$OUT/manifest.json.tmp" "$OUT/manifest.json"
log "done: $OUT/fio ($VERSION, $(du -h "$OUT/fio" | cut -f1), links:$(echo $LIBS | sed 's/^/ /'); $(( $(date +%s) - T0 ))s)"
