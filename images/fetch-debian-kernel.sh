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
# Cached: when OUTDIR/manifest.json exists and the sha256 of OUTDIR/vmlinuz
# matches the one recorded there, nothing is done.
set -eu

usage() { echo "usage: $0 6.1|6.12 OUTDIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
SERIES=$1
OUTDIR=$2
case "$SERIES" in 6.1|6.12) ;; *) usage ;; esac

log() { echo "fetch-debian-kernel: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- cache check ------------------------------------------------------------
if [ -f "$OUTDIR/manifest.json" ] && [ -f "$OUTDIR/vmlinuz" ]; then
    want=$(sed -n 's/.*"vmlinuz_sha256": *"\([0-9a-f]*\)".*/\1/p' "$OUTDIR/manifest.json")
    have=$(sha256sum "$OUTDIR/vmlinuz" | cut -d' ' -f1)
    if [ -n "$want" ] && [ "$want" = "$have" ]; then
        log "cached: $OUTDIR ($(sed -n 's/.*"kernel_version": *"\([^"]*\)".*/\1/p' "$OUTDIR/manifest.json"))"
        exit 0
    fi
    log "cache in $OUTDIR is stale or incomplete; refetching"
fi

for tool in apt-get apt-cache dpkg dpkg-deb sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (this needs a Debian/apt system)"
done

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
    if ! apt-cache policy 2>/dev/null | grep -q 'bookworm-backports'; then
        log "adding bookworm-backports to /etc/apt/sources.list.d"
        cat >/etc/apt/sources.list.d/blklab-bookworm-backports.sources <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
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
PKGVER=$(apt-cache policy "$PKG" | sed -n 's/^ *Candidate: *//p')
[ -n "$PKGVER" ] && [ "$PKGVER" != "(none)" ] || die "no candidate version for $PKG"
log "package: $PKG $PKGVER"

# --- download and unpack ----------------------------------------------------
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
[ "$OUTDIR" != / ] || die "refusing OUTDIR=/"
# Only ever replace an empty directory or one this script filled before.
if [ -n "$(ls -A "$OUTDIR")" ] && [ ! -e "$OUTDIR/manifest.json" ] && [ ! -e "$OUTDIR/vmlinuz" ]; then
    die "$OUTDIR is not empty and was not made by this script; refusing to overwrite it"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/blklab-kernel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM
chmod 755 "$WORK"   # apt-get download may drop privileges to _apt
download() {
    (
        cd "$WORK"
        apt-get download -q "$PKG=$PKGVER" 2>&1 | grep -v 'unsandboxed as root' >&2 || true
    )
    ls "$WORK"/*.deb 2>/dev/null | head -n1
}
DEB=$(download)
if [ -z "$DEB" ]; then
    # Old lists can name a version the mirror no longer has.
    log "download failed; running apt-get update and retrying"
    apt-get update -qq || die "apt-get update failed"
    PKG=$(find_pkg || true)
    [ -n "$PKG" ] || die "no linux-image package found for series $SERIES"
    PKGVER=$(apt-cache policy "$PKG" | sed -n 's/^ *Candidate: *//p')
    log "package: $PKG $PKGVER"
    DEB=$(download)
fi
[ -n "$DEB" ] && [ -f "$DEB" ] || die "apt-get download $PKG=$PKGVER produced no .deb"
DEB_SHA=$(sha256sum "$DEB" | cut -d' ' -f1)
log "unpacking $(basename "$DEB")"
dpkg -x "$DEB" "$WORK/root"

VMLINUZ=$(ls "$WORK"/root/boot/vmlinuz-* 2>/dev/null | head -n1)
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

SHA=$(sha256sum "$OUTDIR/vmlinuz" | cut -d' ' -f1)
cat >"$OUTDIR/manifest.json.tmp" <<EOF
{
  "series": "$SERIES",
  "kernel_version": "$KVER",
  "package": "$PKG",
  "package_version": "$PKGVER",
  "deb_sha256": "$DEB_SHA",
  "vmlinuz_sha256": "$SHA"
}
EOF
mv "$OUTDIR/manifest.json.tmp" "$OUTDIR/manifest.json"
log "done: $OUTDIR (kernel $KVER)"
