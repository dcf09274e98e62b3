#!/bin/sh
# fetch-sysstat.sh --out DIR
#
# Fetch Debian's sysstat package with `apt-get download`, unpack it with
# `dpkg -x` (nothing is installed) and keep only mpstat:
#
#   DIR/mpstat          (usr/bin/mpstat of the package)
#   DIR/manifest.json   (package, version, deb sha256, mpstat sha256, libraries)
#
# Cached: when DIR/manifest.json records the same inputs hash (this script,
# the package version) and the sha256 of DIR/mpstat matches, nothing is done
# ("cached").
set -eu

log() { echo "fetch-sysstat: $*" >&2; }
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

HERE=$(cd "$(dirname "$0")" && pwd)
SELF="$HERE/$(basename "$0")"
sha256() { sha256sum "$1" | cut -d' ' -f1; }
json_field() { sed -n "s/.*\"$2\": *\"\([^\"]*\)\".*/\1/p" "$1" 2>/dev/null | head -n1; }

for tool in apt-get apt-cache dpkg sha256sum ldd; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (this needs a Debian/apt system)"
done

PKG=sysstat
candidate() { apt-cache policy "$PKG" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | head -n1; }
VER=$(candidate)
if [ -z "$VER" ] || [ "$VER" = "(none)" ]; then
    log "no $PKG in the apt lists; running apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed (check the network and /etc/apt/sources.list.d)"
    VER=$(candidate)
    [ -n "$VER" ] && [ "$VER" != "(none)" ] || die "no package $PKG in the apt lists after apt-get update"
fi

inputs() {
    echo "format 1"
    echo "script $(sha256 "$SELF")"
    echo "package $PKG $VER"
}
HASH=$(inputs | sha256sum | cut -d' ' -f1)
if [ -f "$OUT/manifest.json" ] && [ -x "$OUT/mpstat" ] \
   && [ "$(json_field "$OUT/manifest.json" inputs_hash)" = "$HASH" ] \
   && [ "$(json_field "$OUT/manifest.json" sha256)" = "$(sha256 "$OUT/mpstat")" ]; then
    log "cached: $OUT/mpstat ($PKG $VER)"
    exit 0
fi
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ] && [ ! -e "$OUT/manifest.json" ] && [ ! -e "$OUT/mpstat" ]; then
    die "$OUT is not empty and was not made by this script; refusing to overwrite it (choose another --out)"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/blklab-sysstat.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
chmod 755 "$WORK"   # apt-get download may drop privileges to _apt
download() {
    ( cd "$WORK" && apt-get download -q "$PKG=$VER" 2>&1 | grep -v 'unsandboxed as root' >&2 ) || true
    ls "$WORK"/*.deb 2>/dev/null | head -n1
}
log "apt-get download $PKG=$VER"
DEB=$(download)
if [ -z "$DEB" ]; then
    log "download failed; running apt-get update and retrying"
    apt-get update -qq >&2 || die "apt-get update failed"
    VER=$(candidate)
    HASH=$(inputs | sha256sum | cut -d' ' -f1)
    DEB=$(download)
fi
[ -n "$DEB" ] || die "apt-get download $PKG=$VER produced no .deb (check the network / apt sources)"
dpkg -x "$DEB" "$WORK/root" || die "dpkg -x $DEB failed"
[ -f "$WORK/root/usr/bin/mpstat" ] || die "$DEB has no usr/bin/mpstat"
"$WORK/root/usr/bin/mpstat" -V >/dev/null 2>&1 || die "$DEB's mpstat does not run here (mpstat -V)"
LIBS=$(ldd "$WORK/root/usr/bin/mpstat" | awk '/=>/ {print $1; next} /^[ \t]*\// {print $1}' | sed 's,.*/,,' | LC_ALL=C sort -u)

mkdir -p "$OUT"
cp "$WORK/root/usr/bin/mpstat" "$OUT/mpstat.tmp"
chmod 755 "$OUT/mpstat.tmp"
mv "$OUT/mpstat.tmp" "$OUT/mpstat"
LIB_JSON=$(printf '%s\n' $LIBS | awk 'NF {printf "%s\"%s\"", (n++ ? ", " : ""), $1}')
cat > "$OUT/manifest.json.tmp" <<EOF
{
  "kind": "mpstat",
  "package": "$PKG",
  "package_version": "$VER",
  "deb_sha256": "$(sha256 "$DEB")",
  "libraries": [$LIB_JSON],
  "sha256": "$(sha256 "$OUT/mpstat")",
  "inputs_hash": "$HASH",
  "fetched_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
EOF
mv "$OUT/manifest.json.tmp" "$OUT/manifest.json"
log "done: $OUT/mpstat ($PKG $VER)"
