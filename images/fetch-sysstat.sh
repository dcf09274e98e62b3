#!/bin/sh
# fetch-sysstat.sh --out DIR
#
# Fetch Debian's sysstat package with `apt-get download`, unpack it with
# `dpkg -x` (nothing is installed) and keep only mpstat:
#
#   DIR/mpstat          (usr/bin/mpstat of the package)
#   DIR/manifest.json   (package, version, deb sha256, mpstat sha256, libraries)
#
# Cached: when DIR/manifest.json records the same key (this script and
# images/lib.sh; the package version is pinned in the manifest) and the
# sha256 of DIR/mpstat matches, nothing is done ("cached"): no apt.
set -eu

LOG_NAME=fetch-sysstat
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

PKG=sysstat
# The key is this script and lib.sh (images/lib.sh, key_mpstat); the
# package version is pinned in the manifest.
HASH=$(key_mpstat)
if [ -x "$OUT/mpstat" ] && output_matches "$OUT" mpstat sha256 "$HASH"; then
    log "cached: $OUT/mpstat ($PKG $(json_field "$OUT/manifest.json" package_version))"
    exit 0
fi
refuse_foreign "$OUT" mpstat "choose another --out"

need_tools "this needs a Debian/apt system" apt-get apt-cache dpkg sha256sum ldd
VER=$(candidate "$PKG")
if ! have_version "$VER"; then
    log "no $PKG in the apt lists; running apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed (check the network and /etc/apt/sources.list.d)"
    VER=$(candidate "$PKG")
    have_version "$VER" || die "no package $PKG in the apt lists after apt-get update"
fi

apt_work sysstat
log "apt-get download $PKG=$VER"
DEB=$(apt_download "$WORK" "$PKG=$VER")
if [ -z "$DEB" ]; then
    update_and_retry download
    VER=$(candidate "$PKG")
    DEB=$(apt_download "$WORK" "$PKG=$VER")
fi
[ -n "$DEB" ] || die "apt-get download $PKG=$VER produced no .deb (check the network / apt sources)"
dpkg -x "$DEB" "$WORK/root" || die "dpkg -x $DEB failed"
[ -f "$WORK/root/usr/bin/mpstat" ] || die "$DEB has no usr/bin/mpstat"
"$WORK/root/usr/bin/mpstat" -V >/dev/null 2>&1 || die "$DEB's mpstat does not run here (mpstat -V)"
LIBS=$(ldd_names "$WORK/root/usr/bin/mpstat")

mkdir -p "$OUT"
cp "$WORK/root/usr/bin/mpstat" "$OUT/mpstat.tmp"
chmod 755 "$OUT/mpstat.tmp"
mv "$OUT/mpstat.tmp" "$OUT/mpstat"
LIB_JSON=$(printf '%s\n' "$LIBS" | json_list)
cat > "$OUT/manifest.json.tmp" <<EOF
{
  "kind": "mpstat",
  "package": "$PKG",
  "package_version": "$VER",
  "deb_sha256": "$(sha256 "$DEB")",
  "libraries": [$LIB_JSON],
  "sha256": "$(sha256 "$OUT/mpstat")",
  "inputs_hash": "$HASH",
  "fetched_at": "$(utc_now)"
}
EOF
mv "$OUT/manifest.json.tmp" "$OUT/manifest.json"
log "done: $OUT/mpstat ($PKG $VER)"
