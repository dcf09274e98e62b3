#!/bin/sh
# fetch-qsd.sh [--out DIR] [--series 7.2]
#
# The reference qemu-storage-daemon of `blklab bench --instructions` and
# `blklab bench --compare`: Debian 12's QEMU 7.2 build, whatever QEMU the
# machine has installed (new machines of our kind come with 10.0 from
# bookworm-backports, whose daemon runs at well under half 7.2's requests
# per CPU-second, so a ratio against it would flatter blklab).
#
# Debian's qemu-system-common package of the newest 7.2 version apt knows
# is fetched with `apt-get download` and unpacked with `dpkg -x`; nothing is
# installed and no other package changes. The binary is Debian's own build
# of Debian's qemu 7.2 source, the build the recorded reference numbers
# were taken with, and links only libraries of Debian 12 itself.
#
#   DIR/qemu-storage-daemon   (usr/bin/qemu-storage-daemon of the package)
#   DIR/manifest.json         (package, version, deb sha256, binary sha256)
#
# DIR defaults to IMAGE_CACHE/qsd-SERIES. Prints DIR/qemu-storage-daemon on
# stdout. Cached: when DIR/manifest.json records the same inputs hash (this
# script, images/lib.sh, the package version) and the binary's sha256
# matches, nothing is fetched.
set -eu

LOG_NAME=fetch-qsd
USAGE="$0 [--out DIR] [--series 7.2]"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"

OUT=""
SERIES=7.2
while [ $# -gt 0 ]; do
    case "$1" in
    --out|--out=*) opt_value "$@"; OUT=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --series|--series=*) opt_value "$@"; SERIES=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    -h|--help) usage ;;
    *) unknown_arg "$1" ;;
    esac
done
case "$SERIES" in
*[!0-9.]*|"") die "--series must be a QEMU version prefix such as 7.2 (got '$SERIES')" ;;
esac
[ -n "$OUT" ] || OUT="$(image_cache)/qsd-$SERIES"

need_tools "this needs a Debian/apt system" apt-get apt-cache dpkg sha256sum ldd

PKG=qemu-system-common
# series_version: the newest version of PKG in SERIES that apt knows.
series_version() {
    apt-cache madison "$PKG" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}' \
        | grep -E "^(1:)?$(printf '%s' "$SERIES" | sed 's/\./\\./g')[.+~]" | sort -V | tail -n1
}
VER=$(series_version)
if [ -z "$VER" ]; then
    log "no $PKG $SERIES in the apt lists; running apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed (check the network and /etc/apt/sources.list.d)"
    VER=$(series_version)
    [ -n "$VER" ] || die "apt knows no $PKG $SERIES.x (Debian 12 has 7.2; give the daemon with --qsd PATH instead)"
fi

inputs() {
    echo "format 1"
    code_inputs
    echo "package $PKG $VER"
}
HASH=$(inputs | sha256)
BIN=qemu-storage-daemon
if [ -x "$OUT/$BIN" ] && output_matches "$OUT" "$BIN" sha256 "$HASH"; then
    log "cached: $OUT/$BIN ($PKG $VER)"
    echo "$OUT/$BIN"
    exit 0
fi
refuse_foreign "$OUT" "$BIN" "choose another --out"

apt_work qsd
log "apt-get download $PKG=$VER"
DEB=$(apt_download "$WORK" "$PKG=$VER")
if [ -z "$DEB" ]; then
    update_and_retry download
    VER=$(series_version)
    HASH=$(inputs | sha256)
    DEB=$(apt_download "$WORK" "$PKG=$VER")
fi
[ -n "$DEB" ] || die "apt-get download $PKG=$VER produced no .deb (check the network / apt sources)"
dpkg -x "$DEB" "$WORK/root" || die "dpkg -x $DEB failed"
[ -f "$WORK/root/usr/bin/$BIN" ] || die "$DEB has no usr/bin/$BIN"
"$WORK/root/usr/bin/$BIN" --version >"$WORK/version" 2>&1 \
    || die "$DEB's $BIN does not run here: $(head -n3 "$WORK/version")"
grep -q "version $SERIES\." "$WORK/version" \
    || die "$DEB's $BIN is not $SERIES: $(head -n1 "$WORK/version")"
LIBS=$(ldd_names "$WORK/root/usr/bin/$BIN")

mkdir -p "$OUT"
cp "$WORK/root/usr/bin/$BIN" "$OUT/$BIN.tmp"
chmod 755 "$OUT/$BIN.tmp"
mv "$OUT/$BIN.tmp" "$OUT/$BIN"
LIB_JSON=$(printf '%s\n' "$LIBS" | json_list)
cat > "$OUT/manifest.json.tmp" <<EOF
{
  "kind": "qemu-storage-daemon",
  "package": "$PKG",
  "package_version": "$VER",
  "version": "$(jstr "$(head -n1 "$WORK/version")")",
  "deb_sha256": "$(sha256 "$DEB")",
  "libraries": [$LIB_JSON],
  "sha256": "$(sha256 "$OUT/$BIN")",
  "inputs_hash": "$HASH",
  "fetched_at": "$(utc_now)"
}
EOF
mv "$OUT/manifest.json.tmp" "$OUT/manifest.json"
log "done: $OUT/$BIN ($PKG $VER)"
echo "$OUT/$BIN"
