#!/bin/sh
# build-nested-host.sh [--cache DIR] [--qemu PATH] [--key]
#
# The image of the lab's nested mode: an emulated KVM host, booted under
# TCG with an SVM CPU (`qemu-system-x86_64 -accel tcg -cpu EPYC`), in which
# Debian's 6.12 kernel loads kvm_amd and the lab runs as on a real host
# (blklab serves the disks, QEMU boots each guest with `-accel kvm -cpu
# host`). Prints the kernel's path and the initramfs's path on stdout, one
# a line (progress goes to stderr).
#
# DIR/nested-host-HASH/ (HASH: the key's first 16 hex digits):
#   vmlinuz         a copy of the debian-6.12 kernel (fetch-debian-kernel.sh,
#                   run here when DIR/kernel-6.12 is not in the cache)
#   host.cpio       the initramfs, uncompressed newc
#   manifest.json   what it was built from (kernel, QEMU, busybox and libc
#                   packages and versions, modules, firmware, every file
#                   with its size) and the key as inputs_hash
#
# host.cpio: busybox-static and its applets; /init (images/nested-host/init,
# which says what it does and what the lab appends); /lib/modules/KVER with
# kvm_amd, virtio_pci and virtio_blk and every module modprobe loads for
# them (from `modinfo -F depends`; decompressed, depmod run on the copied
# set); QEMU (--qemu, default qemu-system-x86_64 on PATH) as
# /usr/bin/qemu-system-x86_64 with every library ldd lists and the ELF
# interpreter, and the firmware it reads to boot a bzImage on q35
# (QEMU_FIRMWARE in qemu-lib.sh); libgcc_s, libm, libc and the loader for blklab's own binary,
# which the lab adds per run (/lab/run/blklab). Nothing under /lab/run.
#
# Uncompressed newc, not gzip -1: under TCG (-cpu EPYC -smp 2, 3G) the
# two boot to BLKLAB-HOST-INIT alike (QEMU's CPU time 7.5-8.6 s uncompressed,
# 7.7-9.4 s gzip -1, the uncompressed one ahead in each of four alternated
# pairs on a loaded 2-core machine): the kernel inflating 67 MB in emulated
# code costs about what copying the 3x larger initrd costs. What decides:
# cpio pads its output to 512 bytes, so the lab's per-run archive appended
# with `cat` starts aligned, while after a gzip member the kernel wants the
# next archive at a 4-byte boundary ("invalid magic at start of compressed
# archive" otherwise: the run's files silently missing); and no compression
# step. The price is disk: 64 MiB in the cache and in an export instead of
# 20 MiB.
#
# Key: the debian-6.12 kernel's key, the installed QEMU's package and
# version (dpkg; a QEMU from no package: its sha256), the firmware files'
# sha256, busybox-static's and libc6's versions (blklab's binary, built
# on this machine, runs on the image's libc), this script, lib.sh,
# qemu-lib.sh and the init. `--key` prints it as JSON (key, dir, qemu, kernel_key): local
# reads only, no network, no apt.
#
# Cached: DIR/nested-host-HASH/manifest.json with the key and the sha256
# of host.cpio and vmlinuz: nothing is done. Built in DIR/.nested-host.XXXXXX
# and renamed into place, under the cache's lock (DIR/.prepare.lock, as
# prepare.sh and `blklab images import` take it).
#
# Exit status non-zero with a last line `build-nested-host: ERROR: …`
# naming the fix on any failure.
set -eu

LOG_NAME=build-nested-host
USAGE="$0 [--cache DIR] [--qemu PATH] [--key]
  --key: print the image's key and its directory's name in the cache, build nothing"
ARG_MISSING=error
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"
# shellcheck source=images/qemu-lib.sh
. "$HERE/qemu-lib.sh"

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

SERIES=6.12
INIT="$HERE/nested-host/init"
BUSYBOX=${BUSYBOX:-/bin/busybox}
# The modules /init loads; modprobe pulls in what they depend on (kvm_amd:
# kvm, irqbypass, ccp). Built-in ones (Debian 6.12: virtio_pci) are skipped.
MODULES="kvm_amd virtio_pci virtio_blk"
# Libraries blklab's binary links besides QEMU's.
BLKLAB_LIBS="libgcc_s.so.1 libm.so.6 libc.so.6"

[ -f "$INIT" ] || die "$INIT is missing"
command -v "$QEMU" >/dev/null 2>&1 || die "$QEMU not found: apt-get install qemu-system-x86"
need_tools "this needs a Debian system" dpkg-query sha256sum

# --- what goes in (local reads only: the dpkg database, QEMU itself) ------------------------
qemu_identify "$QEMU"
qemu_firmware "$QEMU"
KKEY=$(key_debian_kernel "$SERIES")

inputs() {
    echo "blklab-key nested-host 1"
    echo "kernel debian-$SERIES $KKEY"
    echo "qemu $QID"
    qemu_firmware_inputs
    dep_versions busybox-static libc6
    code_inputs
    qemu_lib_inputs
    echo "init $(sha256 "$INIT")"
}
HASH=$(inputs | sha256)
OUT="$CACHE/nested-host-$(echo "$HASH" | cut -c1-16)"
if [ "$KEY_ONLY" = 1 ]; then
    printf '{"key":"%s","dir":"%s","qemu":"%s","kernel_key":"%s"}\n' \
        "$HASH" "$(basename "$OUT")" "$(jstr "$QID")" "$KKEY"
    exit 0
fi

# cached: OUT holds the image of this key, whole.
cached() {
    output_matches "$OUT" host.cpio host_cpio_sha256 "$HASH" \
        && [ "$(json_field "$OUT/manifest.json" vmlinuz_sha256)" = "$(sha256 "$OUT/vmlinuz" 2>/dev/null)" ]
}
report() {
    echo "$OUT/vmlinuz"
    echo "$OUT/host.cpio"
}
if cached; then
    log "cached: $OUT"
    report
    exit 0
fi

need_tools "apt-get install cpio kmod libc-bin binutils findutils util-linux xz-utils" \
    cpio depmod modinfo ldd readelf find flock xz
[ -x "$BUSYBOX" ] || die "busybox not found at $BUSYBOX (apt-get install busybox-static)"
if ldd "$BUSYBOX" >/dev/null 2>&1; then
    die "$BUSYBOX is dynamically linked (need busybox-static: apt-get install busybox-static)"
fi
for applet in modprobe tar stty nproc dmesg poweroff tail; do
    "$BUSYBOX" --list 2>/dev/null | grep -qx "$applet" \
        || die "$BUSYBOX has no $applet applet (need busybox-static: apt-get install busybox-static)"
done

mkdir -p "$CACHE" || die "cannot create the cache directory $CACHE (choose another with --cache DIR)"
CACHE=$(cd "$CACHE" && pwd)
OUT="$CACHE/${OUT##*/}"
exec 8>"$CACHE/.prepare.lock"
if ! flock -n 8; then
    log "waiting for another user of $CACHE (.prepare.lock)"
    flock 8
fi
if cached; then
    log "cached: $OUT (built meanwhile)"
    report
    exit 0
fi
T0=$(date +%s)

# --- staging: WORK/root is the image's tree, STAGE the cache entry --------------------------
work_dir nested-host
STAGE=$(mktemp -d "$CACHE/.nested-host.XXXXXX")
# shellcheck disable=SC2016  # expanded when the trap runs
on_exit 'rm -rf "$WORK" "$STAGE"'

# --- the kernel: the debian-6.12 recipe, as prepare.sh runs it ------------------------------
KDIR="$CACHE/kernel-$SERIES"
{ sh "$HERE/fetch-debian-kernel.sh" "$SERIES" "$KDIR" </dev/null 2>&1 && echo 0 > "$WORK/kernel.rc" \
    || echo $? > "$WORK/kernel.rc"; } | tee "$WORK/kernel.log" >&2
if [ "$(cat "$WORK/kernel.rc")" != 0 ]; then
    die "debian-$SERIES (images/fetch-debian-kernel.sh): $(grep 'ERROR:' "$WORK/kernel.log" | tail -n1 | sed 's/^.*ERROR: *//')"
fi
MODROOT=$(first "$KDIR"/lib/modules/*)
[ -n "$MODROOT" ] || die "$KDIR has no lib/modules/KVER (rm -rf $KDIR and run again)"
KVER=${MODROOT##*/}
R="$WORK/root"
for d in bin sbin usr/bin usr/sbin lib lib64 proc sys dev tmp run root etc lab; do
    mkdir -p "$R/$d"
done
chmod 1777 "$R/tmp"

cp "$BUSYBOX" "$R/bin/busybox"
"$BUSYBOX" --list-full | while read -r applet; do
    [ -n "$applet" ] || continue
    [ -e "$R/$applet" ] && continue
    mkdir -p "$R/$(dirname "$applet")"
    ln -s /bin/busybox "$R/$applet"
done
ln -sf /bin/busybox "$R/bin/sh"
cp "$INIT" "$R/init"
chmod 755 "$R/init"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\n' > "$R/etc/group"

# copy_file PATH: PATH (dereferenced) at the same path in the image.
copy_file() {
    [ -e "$R$1" ] && return 0
    mkdir -p "$R$(dirname "$1")"
    cp -L "$1" "$R$1"
}

# --- QEMU, its libraries and firmware; blklab's libraries -------------------------------------
mkdir -p "$R/usr/bin"
cp "$QBIN" "$R/usr/bin/qemu-system-x86_64"
chmod 755 "$R/usr/bin/qemu-system-x86_64"
LIBS=$(elf_libs "$QBIN")
for lib in $(echo "$LIBS" | cut -d' ' -f2); do
    copy_file "$lib"
done
INTERP=$(elf_interp "$QBIN")
copy_file "$INTERP"
for name in $BLKLAB_LIBS; do
    lib=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64/ {print $NF; exit}')
    [ -n "$lib" ] || lib=$(first "/lib/x86_64-linux-gnu/$name" "/usr/lib/x86_64-linux-gnu/$name")
    [ -n "$lib" ] || die "no $name on this system (apt-get install libc6 libgcc-s1)"
    copy_file "$lib"
done
for p in $FWPATHS; do
    copy_file "$p"
done

# --- kernel modules: MODULES and their dependencies, depmod'ed ----------------------------------
MB="$R/lib/modules/$KVER"
mkdir -p "$MB"
# modules.builtin: modprobe of a built-in module succeeds (and depmod
# writes its index).
for f in modules.builtin modules.builtin.modinfo; do
    [ ! -f "$MODROOT/$f" ] || cp "$MODROOT/$f" "$MB/$f"
done
# find_ko NAME: NAME's module file below MODROOT ('-' and '_' alike).
find_ko() {
    n1=$(echo "$1" | tr '_' '-')
    n2=$(echo "$1" | tr '-' '_')
    find "$MODROOT/" -type f \( -name "$n1.ko" -o -name "$n1.ko.*" -o -name "$n2.ko" -o -name "$n2.ko.*" \) \
        2>/dev/null | LC_ALL=C sort | head -n1
}
is_builtin() {
    n1=$(echo "$1" | tr '_' '-')
    n2=$(echo "$1" | tr '-' '_')
    [ -f "$MODROOT/modules.builtin" ] && grep -q -e "/$n1\.ko\$" -e "/$n2\.ko\$" "$MODROOT/modules.builtin"
}
COPIED=""
# add_module NAME: NAME and what it depends on, decompressed at their
# paths below kernel/.
add_module() {
    case " $COPIED " in *" $1 "*) return 0 ;; esac
    f=$(find_ko "$1")
    if [ -z "$f" ]; then
        is_builtin "$1" && { log "module $1: built in"; return 0; }
        die "module $1 is neither a module nor built into $KVER"
    fi
    COPIED="$COPIED $1"
    rel=${f#"$MODROOT/"}
    rel=${rel%.ko*}.ko
    mkdir -p "$MB/$(dirname "$rel")"
    case "$f" in
    *.ko.xz) xz -dc "$f" > "$MB/$rel" || die "cannot decompress $f" ;;
    *.ko.zst) zstd -q -dc "$f" > "$MB/$rel" || die "cannot decompress $f (apt-get install zstd)" ;;
    *.ko.gz) gzip -dc "$f" > "$MB/$rel" || die "cannot decompress $f" ;;
    *) cp "$f" "$MB/$rel" ;;
    esac
    log "module $1: $rel"
    for dep in $(modinfo -F depends "$MB/$rel" | tr ',' ' '); do
        add_module "$dep"
    done
}
for m in $MODULES; do
    add_module "$m"
done
depmod -b "$R" "$KVER" || die "depmod -b $R $KVER failed"
[ -s "$MB/modules.dep" ] || die "depmod wrote no $MB/modules.dep"

# --- archive, manifest, install ---------------------------------------------------------------
cp "$KDIR/vmlinuz" "$STAGE/vmlinuz"
(cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$STAGE/host.cpio" \
    || die "cpio failed"
FILES_JSON=$(cd "$R" && find . -type f -printf '%P %s\n' | LC_ALL=C sort \
    | awk '{ printf "%s\n    {\"path\": \"/%s\", \"size\": %s}", (n++ ? "," : ""), $1, $2 }')
FW_JSON=$(firmware_json)
UNPACKED=$(cd "$R" && find . -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
qpkg_json=null; qver_json=null
if [ -n "$QPKG" ]; then qpkg_json="\"$QPKG\""; qver_json="\"$(jstr "$QPKGVER")\""; fi
cat > "$STAGE/manifest.json" <<EOF
{
  "kind": "nested-host",
  "kernel_series": "$SERIES",
  "kernel_key": "$KKEY",
  "kernel_version": "$KVER",
  "kernel_package": "$(json_field "$KDIR/manifest.json" package)",
  "kernel_package_version": "$(json_field "$KDIR/manifest.json" package_version)",
  "qemu_path": "$(jstr "$QBIN")",
  "qemu_package": $qpkg_json,
  "qemu_package_version": $qver_json,
  "qemu_version": "$(jstr "$("$QBIN" --version | head -n1)")",
  "busybox_version": "$(pkgver busybox-static)",
  "libc6_version": "$(pkgver libc6)",
  "modules": [$(echo "$COPIED" | json_list)],
  "firmware": [$FW_JSON],
  "format": "newc",
  "host_cpio_size": $(wc -c < "$STAGE/host.cpio"),
  "unpacked_size": $UNPACKED,
  "host_cpio_sha256": "$(sha256 "$STAGE/host.cpio")",
  "vmlinuz_sha256": "$(sha256 "$STAGE/vmlinuz")",
  "inputs_hash": "$HASH",
  "built_at": "$(utc_now)",
  "files": [$FILES_JSON
  ]
}
EOF
inputs > "$STAGE/inputs"
chmod 755 "$STAGE"
if [ -e "$OUT" ]; then
    log "replacing $OUT (another recipe's, stale or incomplete)"
    mv "$OUT" "$STAGE.old"
fi
mv "$STAGE" "$OUT"
rm -rf "$STAGE.old"
log "built $OUT in $(( $(date +%s) - T0 ))s: host.cpio $(du -h "$OUT/host.cpio" | cut -f1), kernel $KVER, $QID"
report
