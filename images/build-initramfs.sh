#!/bin/sh
# build-initramfs.sh --kernel-dir DIR --out FILE.cpio.gz [--extra-dir DIR]
#
# Build a small gzip'd newc initramfs for blklab guests:
#   - busybox-static (/bin/busybox + a symlink for every applet)
#   - /usr/bin/fio, every library `ldd` lists for it, and the ELF interpreter
#   - the virtio modules the kernel in DIR (from fetch-debian-kernel.sh) needs,
#     as plain .ko in /lib/modules/blklab/, load order in /blklab/modules
#     (built-in ones are skipped; .ko.xz/.ko.zst are decompressed here so that
#     busybox insmod can load them)
#   - /init (images/initramfs/init) and the guest scripts of images/guest/ in
#     /blklab/; files of --extra-dir DIR are copied into /blklab/ as well
#
# Cached: when FILE exists and FILE.inputs-hash matches the hash of the inputs
# (these scripts, guest scripts, extra dir, kernel manifest, fio and busybox
# binaries and versions), nothing is done.
set -eu

log() { echo "build-initramfs: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { echo "usage: $0 --kernel-dir DIR --out FILE.cpio.gz [--extra-dir DIR]" >&2; exit 2; }

KDIR=""; OUT=""; EXTRA=""
while [ $# -gt 0 ]; do
    case "$1" in
    --kernel-dir) [ $# -ge 2 ] || usage; KDIR=$2; shift 2 ;;
    --kernel-dir=*) KDIR=${1#*=}; shift ;;
    --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
    --out=*) OUT=${1#*=}; shift ;;
    --extra-dir) [ $# -ge 2 ] || usage; EXTRA=$2; shift 2 ;;
    --extra-dir=*) EXTRA=${1#*=}; shift ;;
    -h|--help) usage ;;
    *) log "unknown argument: $1"; usage ;;
    esac
done
[ -n "$KDIR" ] && [ -n "$OUT" ] || usage

HERE=$(cd "$(dirname "$0")" && pwd)
INIT="$HERE/initramfs/init"
GUEST="$HERE/guest"
FIO=${FIO:-/usr/bin/fio}
BUSYBOX=${BUSYBOX:-/bin/busybox}
# Load order for the virtio stack; each is skipped when built in.
MODULES="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk"

[ -f "$KDIR/manifest.json" ] || die "$KDIR/manifest.json missing (run fetch-debian-kernel.sh first)"
[ -f "$INIT" ] || die "$INIT missing"
[ -x "$FIO" ] || die "fio not found at $FIO (apt-get install fio)"
[ -x "$BUSYBOX" ] || die "busybox not found at $BUSYBOX (apt-get install busybox-static)"
if ! "$BUSYBOX" --list 2>/dev/null | grep -qx insmod; then
    die "$BUSYBOX has no insmod applet (need busybox-static)"
fi
if ldd "$BUSYBOX" >/dev/null 2>&1; then
    die "$BUSYBOX is dynamically linked (need busybox-static)"
fi
for tool in cpio gzip ldd sha256sum find; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done
[ -z "$EXTRA" ] || [ -d "$EXTRA" ] || die "--extra-dir $EXTRA is not a directory"

# --- inputs hash --------------------------------------------------------------
hash_dir() {  # content hash of every file below $1, path-relative, sorted
    (cd "$1" && find . -type f | LC_ALL=C sort | while read -r f; do
        printf '%s %s\n' "$f" "$(sha256sum "$f" | cut -d' ' -f1)"
    done)
}
inputs() {
    echo "format 1"
    echo "script $(sha256sum "$0" | cut -d' ' -f1)"
    echo "init $(sha256sum "$INIT" | cut -d' ' -f1)"
    [ -d "$GUEST" ] && hash_dir "$GUEST" | sed 's/^/guest /'
    [ -n "$EXTRA" ] && hash_dir "$EXTRA" | sed 's/^/extra /'
    echo "manifest $(sha256sum "$KDIR/manifest.json" | cut -d' ' -f1)"
    echo "fio $("$FIO" --version) $(sha256sum "$FIO" | cut -d' ' -f1)"
    echo "busybox $(sha256sum "$BUSYBOX" | cut -d' ' -f1)"
    echo "modules $MODULES"
}
HASH=$(inputs | sha256sum | cut -d' ' -f1)
if [ -f "$OUT" ] && [ -f "$OUT.inputs-hash" ] && [ "$(cat "$OUT.inputs-hash")" = "$HASH" ]; then
    log "cached: $OUT"
    exit 0
fi

# --- staging ------------------------------------------------------------------
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/blklab-initramfs.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT INT TERM
R="$STAGE/root"
mkdir -p "$R"
for d in bin sbin usr/bin usr/sbin lib lib64 proc sys dev tmp run root etc \
         lib/modules/blklab blklab; do
    mkdir -p "$R/$d"
done
chmod 1777 "$R/tmp"

# busybox + applet links
cp "$BUSYBOX" "$R/bin/busybox"
"$BUSYBOX" --list-full | while read -r applet; do
    [ -n "$applet" ] || continue
    [ -e "$R/$applet" ] && continue
    mkdir -p "$R/$(dirname "$applet")"
    ln -s /bin/busybox "$R/$applet"
done
ln -sf /bin/busybox "$R/bin/sh"

# fio + shared libraries + ELF interpreter, at the paths ldd reports
copy_file() {  # copy $1 (dereferenced) to the same path inside the initramfs
    mkdir -p "$R$(dirname "$1")"
    cp -L "$1" "$R$1"
}
mkdir -p "$R/usr/bin"
cp -L "$FIO" "$R/usr/bin/fio"
LIBS=$(ldd "$FIO" | awk '/=> \//{print $3} /^[ \t]*\//{print $1}' | LC_ALL=C sort -u)
[ -n "$LIBS" ] || die "ldd $FIO listed no libraries"
for lib in $LIBS; do
    [ -e "$lib" ] || die "library $lib (from ldd $FIO) does not exist"
    copy_file "$lib"
done
# Make sure the interpreter named in the ELF header is there too.
INTERP=$(LC_ALL=C readelf -l "$FIO" 2>/dev/null \
    | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p' || true)
if [ -n "$INTERP" ] && [ ! -e "$R$INTERP" ]; then
    copy_file "$INTERP"
fi
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\n' > "$R/etc/group"

# kernel modules
MODROOT=$(ls -d "$KDIR"/lib/modules/* 2>/dev/null | head -n1)
[ -n "$MODROOT" ] && [ -d "$MODROOT/kernel" ] || die "no lib/modules/*/kernel in $KDIR"
KVER=${MODROOT##*/}
: > "$R/blklab/modules"
for m in $MODULES; do
    f=$(find "$MODROOT/kernel" -type f \( -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" -o -name "$m.ko.gz" \) | head -n1)
    if [ -z "$f" ]; then
        if grep -q "/$m\.ko\$" "$MODROOT/modules.builtin" 2>/dev/null; then
            log "module $m: built in"
        else
            log "module $m: not found as a module (assuming built in)"
        fi
        continue
    fi
    dst="$R/lib/modules/blklab/$m.ko"
    case "$f" in
    *.ko.xz)  xz -dc "$f" > "$dst" ;;
    *.ko.zst) zstd -q -dc "$f" > "$dst" ;;
    *.ko.gz)  gzip -dc "$f" > "$dst" ;;
    *)        cp "$f" "$dst" ;;
    esac
    echo "$m" >> "$R/blklab/modules"
    log "module $m: ${f#"$MODROOT"/}"
done
grep -qx virtio_blk "$R/blklab/modules" || \
    grep -q '/virtio_blk\.ko$' "$MODROOT/modules.builtin" 2>/dev/null || \
    die "virtio_blk is neither a module nor built into $KVER"

# init and guest scripts
cp "$INIT" "$R/init"
chmod 755 "$R/init"
if [ -d "$GUEST" ]; then
    cp -R "$GUEST"/. "$R/blklab/"
fi
if [ -n "$EXTRA" ]; then
    cp -R "$EXTRA"/. "$R/blklab/"
fi
find "$R/blklab" -type f ! -name modules -exec chmod 755 {} +
echo "$KVER" > "$R/blklab/kernel-version"

# --- archive ------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
(cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -n -6 > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$HASH" > "$OUT.inputs-hash"
log "built $OUT ($(du -h "$OUT" | cut -f1), kernel $KVER)"
