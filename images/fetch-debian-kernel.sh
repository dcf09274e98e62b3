#!/bin/sh
# fetch-debian-kernel.sh SERIES OUTDIR
#
# Download Debian's amd64 kernel package for SERIES (6.1 or 6.12) with
# `apt-get download`, unpack it with `dpkg -x` (nothing is installed, /boot is
# never touched) and lay out in OUTDIR:
#
#   OUTDIR/vmlinuz  OUTDIR/System.map  OUTDIR/config
#   OUTDIR/lib/modules/<kver>/...       (the package's whole modules tree)
#   OUTDIR/manifest.json                (kernel version, package, sha256)
#
# Cached: when OUTDIR/manifest.json records this recipe's key (the series,
# this script and images/lib.sh) and the sha256 of OUTDIR/vmlinuz, nothing
# is done (no apt): a newer Debian upload is not picked up (rm -rf OUTDIR).
set -eu

LOG_NAME=fetch-debian-kernel
USAGE="$0 6.1|6.12 OUTDIR"
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"

[ $# -eq 2 ] || usage
SERIES=$1
OUTDIR=$2
case "$SERIES" in 6.1|6.12) ;; *) usage ;; esac

# --- cache check ------------------------------------------------------------
# The key (images/lib.sh, key_debian_kernel) is the series, this script and
# lib.sh; the package and version fetched are pinned in the manifest.
HASH=$(key_debian_kernel "$SERIES")
if kernel_cached "$OUTDIR" "$HASH"; then
    log "cached: $OUTDIR ($(json_field "$OUTDIR/manifest.json" kernel_version), $(json_field "$OUTDIR/manifest.json" package) $(json_field "$OUTDIR/manifest.json" package_version))"
    exit 0
fi
if [ -f "$OUTDIR/manifest.json" ]; then
    log "cache in $OUTDIR is of another recipe, stale or incomplete; refetching"
fi

need_tools "this needs a Debian/apt system" apt-get apt-cache dpkg dpkg-deb sha256sum

# --- make sure the package lists exist --------------------------------------
if ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
    log "apt lists missing; running apt-get update"
    apt-get update -qq || die "apt-get update failed"
fi

# --- find the package name ----------------------------------------------------
# Print the newest generic amd64 image package matching the regex $1.
newest_matching() {
    apt-cache search --names-only "$1" 2>/dev/null | cut -d' ' -f1 \
        | grep -v -e '-cloud-' -e '-rt-' -e '-dbg$' | sort -V | tail -n1
}

find_pkg() {
    case "$SERIES" in
    6.1)
        # The concrete package the linux-image-amd64 metapackage depends on.
        apt-cache depends linux-image-amd64 2>/dev/null \
            | sed -n 's/^ *Depends: \(linux-image-6\.1\.[^ ]*-amd64\)$/\1/p' | head -n1
        ;;
    6.12)
        newest_matching '^linux-image-6\.12\.[0-9].*-amd64-unsigned$'
        ;;
    esac
}

PKG=$(find_pkg || true)
if [ -z "$PKG" ] && [ "$SERIES" = 6.12 ]; then
    # Not in the Debian 12 lists: try bookworm-backports.
    if ! has_suite bookworm-backports; then
        log "adding bookworm-backports to /etc/apt/sources.list.d"
        add_backports
    fi
    apt-get update -qq || die "apt-get update failed"
    PKG=$(find_pkg || true)
fi
if [ -z "$PKG" ]; then
    log "apt lists may be old; running apt-get update and retrying"
    apt-get update -qq || die "apt-get update failed"
    PKG=$(find_pkg || true)
fi
[ -n "$PKG" ] || die "no linux-image package found for series $SERIES"
PKGVER=$(candidate "$PKG")
have_version "$PKGVER" || die "no candidate version for $PKG"
log "package: $PKG $PKGVER"

# --- download and unpack ----------------------------------------------------
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
[ "$OUTDIR" != / ] || die "refusing OUTDIR=/"
# Only ever replace an empty directory or one this script filled before.
refuse_foreign "$OUTDIR" vmlinuz
apt_work kernel
DEB=$(apt_download "$WORK" "$PKG=$PKGVER")
if [ -z "$DEB" ]; then
    # Old lists can name a version the mirror no longer has.
    update_and_retry download
    PKG=$(find_pkg || true)
    [ -n "$PKG" ] || die "no linux-image package found for series $SERIES"
    PKGVER=$(candidate "$PKG")
    log "package: $PKG $PKGVER"
    DEB=$(apt_download "$WORK" "$PKG=$PKGVER")
fi
{ [ -n "$DEB" ] && [ -f "$DEB" ]; } || die "apt-get download $PKG=$PKGVER produced no .deb"
DEB_SHA=$(sha256 "$DEB")
log "unpacking $(basename "$DEB")"
dpkg -x "$DEB" "$WORK/root"

VMLINUZ=$(first "$WORK"/root/boot/vmlinuz-*)
[ -n "$VMLINUZ" ] || die "no boot/vmlinuz-* in $PKG"
KVER=${VMLINUZ##*/vmlinuz-}
MODSRC=""
for d in "$WORK/root/lib/modules/$KVER" "$WORK/root/usr/lib/modules/$KVER"; do
    [ -d "$d" ] && MODSRC=$d && break
done
[ -n "$MODSRC" ] || die "no modules tree for $KVER in $PKG"

# Replace the previous contents atomically enough: build next to it, then swap.
rm -f "$OUTDIR/manifest.json"
rm -rf "${OUTDIR:?}/lib" "${OUTDIR:?}/vmlinuz" "${OUTDIR:?}/System.map" "${OUTDIR:?}/config"
mkdir -p "$OUTDIR/lib/modules"
cp "$VMLINUZ" "$OUTDIR/vmlinuz"
cp "$WORK/root/boot/System.map-$KVER" "$OUTDIR/System.map"
cp "$WORK/root/boot/config-$KVER" "$OUTDIR/config"
mv "$MODSRC" "$OUTDIR/lib/modules/$KVER"

SHA=$(sha256 "$OUTDIR/vmlinuz")
cat >"$OUTDIR/manifest.json.tmp" <<EOF
{
  "kind": "debian",
  "series": "$SERIES",
  "kernel_version": "$KVER",
  "package": "$PKG",
  "package_version": "$PKGVER",
  "deb_sha256": "$DEB_SHA",
  "vmlinuz_sha256": "$SHA",
  "inputs_hash": "$HASH",
  "fetched_at": "$(utc_now)"
}
EOF
mv "$OUTDIR/manifest.json.tmp" "$OUTDIR/manifest.json"
log "done: $OUTDIR (kernel $KVER)"
