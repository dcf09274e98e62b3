#!/bin/sh
# build-initramfs.sh --kernel-dir DIR --out FILE.cpio.gz [--extra-dir DIR]
#                    [--fio PATH] [--mpstat PATH] [--guest-scripts DIR]
#
# Build a small gzip'd newc initramfs for blklab guests:
#   - busybox-static (/bin/busybox + a symlink for every applet)
#   - fio as /usr/bin/fio (--fio PATH, default $FIO or /usr/bin/fio), every
#     library `ldd` lists for it, and the ELF interpreter; the same for
#     mpstat as /usr/bin/mpstat when --mpstat PATH is given, and dmsetup as
#     /usr/sbin/dmsetup (--dmsetup PATH, default the host's; without one the
#     image cannot run `stack multipath` scenarios, and a warning says so)
#   - the virtio modules the kernel in DIR needs, as plain .ko in
#     /lib/modules/blklab/, load order in /blklab/modules (built-in ones are
#     skipped; .ko.xz/.ko.zst/.ko.gz are decompressed here so that busybox
#     insmod can load them)
#   - scsi_debug, null_blk and dm-multipath with its path selectors when the
#     kernel has them as modules, with the
#     modules they need (modinfo -F depends; sd_mod for scsi_debug's disks),
#     also in /lib/modules/blklab/ but NOT in /blklab/modules: scenarios
#     insmod them with parameters. /blklab/modules-available has one line per
#     module, `NAME: DEP... NAME`, the insmod order.
#   - /init (images/initramfs/init) and the guest scripts of images/guest/ in
#     /blklab/; files of --extra-dir DIR are copied into /blklab/ as well
#   - --guest-scripts DIR copied to /blklab/guest-scripts/, and /blklab/lab,
#     which runs /blklab/guest-scripts/lab.sh (blklab.run=lab)
#
# DIR is a kernel directory as fetch-debian-kernel.sh or build-kernel.sh lay it
# out: DIR/manifest.json and, unless every needed driver is built in,
# DIR/lib/modules/KVER/.
#
# Writes FILE, FILE.inputs-hash and FILE.manifest.json (inputs hash, sha256 and
# size of FILE, kernel version, fio version, mpstat, modules).
#
# Cached: when FILE exists and FILE.inputs-hash matches the key of the inputs
# (this script and images/lib.sh, /init, images/guest, the extra dir, the
# guest-scripts dir, and the kernel, fio and mpstat: by their keys when they
# come from the image cache, else by content; images/lib.sh key_initramfs),
# nothing is done. The host's busybox and dmsetup are not in the key (the
# manifest records their sha256): an imported image stays valid. The check
# comes before the build's tools are looked for: a cache hit runs neither
# busybox nor cpio, gzip, ldd or readelf (a host without them runs the lab
# from imported images).
set -eu

LOG_NAME=build-initramfs
USAGE="$0 --kernel-dir DIR --out FILE.cpio.gz [--extra-dir DIR] [--fio PATH] [--mpstat PATH] [--dmsetup PATH] [--guest-scripts DIR]"
ARG_MISSING=error
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"

KDIR=""; OUT=""; EXTRA=""; FIO=${FIO:-/usr/bin/fio}; MPSTAT=""; GSCRIPTS=""
DMSETUP=${DMSETUP:-$(command -v dmsetup || true)}
while [ $# -gt 0 ]; do
    case "$1" in
    --kernel-dir|--kernel-dir=*) opt_value "$@"; KDIR=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --out|--out=*) opt_value "$@"; OUT=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --extra-dir|--extra-dir=*) opt_value "$@"; EXTRA=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --fio|--fio=*) opt_value "$@"; FIO=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --mpstat|--mpstat=*) opt_value "$@"; MPSTAT=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --dmsetup|--dmsetup=*) opt_value "$@"; DMSETUP=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --guest-scripts|--guest-scripts=*) opt_value "$@"; GSCRIPTS=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    -h|--help) usage ;;
    *) unknown_arg "$1" ;;
    esac
done
{ [ -n "$KDIR" ] && [ -n "$OUT" ]; } || usage

INIT="$HERE/initramfs/init"
GUEST="$HERE/guest"
BUSYBOX=${BUSYBOX:-/bin/busybox}
# Load order for the virtio stack; each is skipped when built in.
MODULES="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk"
# Modules scenarios load themselves (insmod with parameters), and the
# modules each needs besides its `depends` (sd_mod turns scsi_debug's LUNs
# into /dev/sdX disks).
EXTRA_MODULES="scsi_debug null_blk dm_multipath dm_service_time dm_round_robin dm_queue_length"
companions() { case "$1" in scsi_debug) echo sd_mod ;; esac; }

[ -f "$KDIR/manifest.json" ] || die "$KDIR/manifest.json missing (run fetch-debian-kernel.sh or build-kernel.sh first)"
[ -f "$INIT" ] || die "$INIT missing"
{ [ -f "$FIO" ] && [ -x "$FIO" ]; } || die "fio not found at $FIO (apt-get install fio, or --fio PATH to a fio binary, e.g. from images/build-fio.sh)"
[ -z "$MPSTAT" ] || { [ -f "$MPSTAT" ] && [ -x "$MPSTAT" ]; } \
    || die "--mpstat $MPSTAT is not an executable file (images/fetch-sysstat.sh makes one)"
if [ -z "$DMSETUP" ]; then
    log "WARNING: no dmsetup on this host (apt-get install dmsetup): the image cannot run \`stack multipath\` scenarios"
elif ! { [ -f "$DMSETUP" ] && [ -x "$DMSETUP" ]; }; then
    die "--dmsetup $DMSETUP is not an executable file"
fi
[ -z "$EXTRA" ] || [ -d "$EXTRA" ] || die "--extra-dir $EXTRA is not a directory"
if [ -n "$GSCRIPTS" ]; then
    [ -d "$GSCRIPTS" ] || die "--guest-scripts $GSCRIPTS is not a directory"
    [ -f "$GSCRIPTS/lab.sh" ] || log "WARNING: $GSCRIPTS has no lab.sh: /blklab/lab will fail in the guest"
fi

# --- inputs hash --------------------------------------------------------------
# The key (images/lib.sh, key_initramfs): this script and lib.sh, /init,
# guest/, the guest scripts and extra dir, and the kernel, fio and mpstat by
# their own keys when they are artifacts of the image cache (by content
# otherwise). The host's busybox and dmsetup are recorded in the manifest.
HASH=$(key_initramfs "$(kernel_id "$KDIR")" "$(artifact_id "$FIO")" \
    "$(if [ -n "$MPSTAT" ]; then artifact_id "$MPSTAT"; else echo none; fi)" "$GSCRIPTS" "$EXTRA")
if [ -f "$OUT" ] && [ -f "$OUT.inputs-hash" ] && [ -f "$OUT.manifest.json" ] \
   && [ "$(cat "$OUT.inputs-hash")" = "$HASH" ] \
   && [ "$(json_field "$OUT.manifest.json" sha256)" = "$(sha256 "$OUT")" ]; then
    log "cached: $OUT"
    exit 0
fi

# --- the build's tools (a cache hit needs none of them) -------------------------
[ -x "$BUSYBOX" ] || die "busybox not found at $BUSYBOX (apt-get install busybox-static)"
if ! "$BUSYBOX" --list 2>/dev/null | grep -qx insmod; then
    die "$BUSYBOX has no insmod applet (need busybox-static: apt-get install busybox-static)"
fi
if ldd "$BUSYBOX" >/dev/null 2>&1; then
    die "$BUSYBOX is dynamically linked (need busybox-static: apt-get install busybox-static)"
fi
need_tools "apt-get install cpio gzip libc-bin binutils findutils" cpio gzip ldd sha256sum find readelf

# --- staging ------------------------------------------------------------------
work_dir initramfs
STAGE=$WORK
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

# An ELF binary + its shared libraries + its ELF interpreter, the libraries at
# the paths ldd reports.
copy_file() {  # copy $1 (dereferenced) to the same path inside the initramfs
    mkdir -p "$R$(dirname "$1")"
    cp -L "$1" "$R$1"
}
copy_elf() {  # copy_elf BINARY DEST (path inside the initramfs)
    rm -f "$R$2"   # busybox may have an applet link there
    mkdir -p "$R$(dirname "$2")"
    cp -L "$1" "$R$2"
    chmod 755 "$R$2"
    libs=$(ldd "$1" | awk '/=> \//{print $3} /^[ \t]*\//{print $1}' | LC_ALL=C sort -u)
    [ -n "$libs" ] || die "ldd $1 listed no libraries (a static binary needs no copy_elf)"
    for lib in $libs; do
        [ -e "$lib" ] || die "library $lib (from ldd $1) does not exist"
        [ -e "$R$lib" ] || copy_file "$lib"
    done
    # Make sure the interpreter named in the ELF header is there too.
    interp=$(LC_ALL=C readelf -l "$1" 2>/dev/null \
        | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p' || true)
    if [ -n "$interp" ] && [ ! -e "$R$interp" ]; then
        copy_file "$interp"
    fi
}
copy_elf "$FIO" /usr/bin/fio
FIO_VERSION=$("$FIO" --version)
if [ -n "$MPSTAT" ]; then
    copy_elf "$MPSTAT" /usr/bin/mpstat
fi
if [ -n "$DMSETUP" ]; then
    copy_elf "$DMSETUP" /usr/sbin/dmsetup
fi
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\n' > "$R/etc/group"

# --- kernel modules -------------------------------------------------------------
MODROOT=$(first "$KDIR"/lib/modules/*)
if [ -n "$MODROOT" ]; then
    KVER=${MODROOT##*/}
    MODROOT="$MODROOT/"   # (it may be a symlink)
else
    KVER=$(json_field "$KDIR/manifest.json" kernel_version)
    [ -n "$KVER" ] || die "$KDIR has no lib/modules/KVER and its manifest.json no kernel_version"
    log "WARNING: $KDIR has no lib/modules/: assuming the kernel has virtio-pci and virtio-blk built in"
fi
MB="$R/lib/modules/blklab"

find_ko() {  # find_ko NAME: path of NAME's module file ('-' and '_' match each other)
    [ -n "$MODROOT" ] || return 0
    n1=$1
    n2=$(echo "$1" | tr '_' '-')
    n3=$(echo "$1" | tr '-' '_')
    find "$MODROOT" -type f \( -name "$n1.ko" -o -name "$n1.ko.xz" -o -name "$n1.ko.zst" -o -name "$n1.ko.gz" \
        -o -name "$n2.ko" -o -name "$n2.ko.xz" -o -name "$n2.ko.zst" -o -name "$n2.ko.gz" \
        -o -name "$n3.ko" -o -name "$n3.ko.xz" -o -name "$n3.ko.zst" -o -name "$n3.ko.gz" \) \
        2>/dev/null | LC_ALL=C sort | head -n1
}
is_builtin() {  # is_builtin NAME
    [ -n "$MODROOT" ] && [ -f "${MODROOT}modules.builtin" ] || return 1
    n2=$(echo "$1" | tr '_' '-')
    n3=$(echo "$1" | tr '-' '_')
    grep -q -e "/$1\.ko\$" -e "/$n2\.ko\$" -e "/$n3\.ko\$" "${MODROOT}modules.builtin"
}
install_ko() {  # install_ko FILE NAME: plain NAME.ko in /lib/modules/blklab
    dst="$MB/$2.ko"
    [ -e "$dst" ] && return 0
    case "$1" in
    *.ko.xz)  xz -dc "$1" > "$dst" || die "cannot decompress $1 (apt-get install xz-utils)" ;;
    *.ko.zst) zstd -q -dc "$1" > "$dst" || die "cannot decompress $1 (apt-get install zstd)" ;;
    *.ko.gz)  gzip -dc "$1" > "$dst" || die "cannot decompress $1" ;;
    *)        cp "$1" "$dst" ;;
    esac
}
ko_name() { b=${1##*/}; echo "${b%%.ko*}"; }

: > "$R/blklab/modules"
for m in $MODULES; do
    f=$(find_ko "$m")
    if [ -z "$f" ]; then
        if is_builtin "$m"; then
            log "module $m: built in"
        else
            log "module $m: not found as a module (assuming built in)"
        fi
        continue
    fi
    install_ko "$f" "$m"
    echo "$m" >> "$R/blklab/modules"
    log "module $m: ${f#"$MODROOT"}"
done
if [ -n "$MODROOT" ]; then
    grep -qx virtio_blk "$R/blklab/modules" || is_builtin virtio_blk || \
        die "virtio_blk is neither a module nor built into $KVER (modules.builtin of $MODROOT)"
fi

# The scenario modules: each with the modules it depends on, deps first.
ORDER=""; STACK=""
resolve() {  # resolve NAME: append NAME's module closure to ORDER (deps first)
    case " $ORDER " in *" $1 "*) return 0 ;; esac
    case " $STACK " in *" $1 "*) die "module dependency cycle through $1 ($STACK)" ;; esac
    rf=$(find_ko "$1")
    if [ -z "$rf" ]; then
        is_builtin "$1" && return 0
        die "module $1 (needed by:$STACK) is neither a module nor built into $KVER"
    fi
    rn=$(ko_name "$rf")
    install_ko "$rf" "$rn"
    STACK="$STACK $1"
    deps=$(modinfo -F depends "$MB/$rn.ko" 2>/dev/null | tr ',' ' ') \
        || die "modinfo $MB/$rn.ko failed (apt-get install kmod)"
    for dep in $deps $(companions "$1"); do
        resolve "$dep"
    done
    STACK=${STACK% "$1"}
    # (rf and rn belong to the last recursive call by now)
    ORDER="$ORDER $(ko_name "$(find_ko "$1")")"
}
: > "$R/blklab/modules-available"
AVAILABLE=""
for m in $EXTRA_MODULES; do
    f=$(find_ko "$m")
    if [ -z "$f" ]; then
        if is_builtin "$m"; then
            log "module $m: built in (not loadable with parameters; not listed)"
        else
            log "module $m: not in this kernel"
        fi
        continue
    fi
    command -v modinfo >/dev/null 2>&1 || die "modinfo not found (apt-get install kmod)"
    ORDER=""; STACK=""
    resolve "$m"
    echo "$m:$ORDER" >> "$R/blklab/modules-available"
    AVAILABLE="$AVAILABLE $m"
    log "module $m: insmod order$ORDER"
done

# --- init, guest scripts --------------------------------------------------------
cp "$INIT" "$R/init"
chmod 755 "$R/init"
if [ -d "$GUEST" ]; then
    cp -R "$GUEST"/. "$R/blklab/"
fi
if [ -n "$EXTRA" ]; then
    cp -R "$EXTRA"/. "$R/blklab/"
fi
find "$R/blklab" -type f ! -name modules ! -name modules-available -exec chmod 755 {} +
if [ -n "$GSCRIPTS" ]; then
    mkdir -p "$R/blklab/guest-scripts"
    cp -R "$GSCRIPTS"/. "$R/blklab/guest-scripts/"
    find "$R/blklab/guest-scripts" -type f -name '*.sh' -exec chmod 755 {} +
    cat > "$R/blklab/lab" <<'EOF'
#!/bin/sh
# blklab.run=lab: the lab's guest side (docs/lab-protocol.md).
exec /bin/sh /blklab/guest-scripts/lab.sh "$@"
EOF
else
    cat > "$R/blklab/lab" <<'EOF'
#!/bin/sh
echo "BLKLAB-ERROR this initramfs has no guest-scripts (built without build-initramfs.sh --guest-scripts)"
exit 127
EOF
fi
chmod 755 "$R/blklab/lab"
echo "$KVER" > "$R/blklab/kernel-version"

# --- archive ------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
(cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -n -6 > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
SIZE=$(wc -c < "$OUT")
AVAIL_JSON=$(awk -F': *' 'NF {
        n = split($2, d, " "); s = ""
        for (i = 1; i <= n; i++) s = s (i > 1 ? ", " : "") "\"" d[i] "\""
        printf "%s\"%s\": [%s]", (k++ ? ", " : ""), $1, s
    }' "$R/blklab/modules-available")
# The guest's own files, apart from the kernel's: /init, images/guest/ and
# the guest scripts (blklab compare refuses sides whose images differ here).
guest_files_id() {
    {
        echo "init $(sha256 "$HERE/initramfs/init")"
        [ ! -d "$HERE/guest" ] || hash_dir "$HERE/guest" | sed 's/^/guest /'
        [ -z "$GSCRIPTS" ] || hash_dir "$GSCRIPTS" | sed 's/^/guest-scripts /'
        [ -z "$EXTRA" ] || hash_dir "$EXTRA" | sed 's/^/extra /'
    } | sha256
}
if [ -n "$MPSTAT" ]; then MPSTAT_SHA="\"$(sha256 "$MPSTAT")\""; else MPSTAT_SHA=null; fi
cat > "$OUT.manifest.json.tmp" <<EOF
{
  "kind": "initramfs",
  "file": "$(jstr "$OUT")",
  "sha256": "$(sha256 "$OUT")",
  "size": $SIZE,
  "inputs_hash": "$HASH",
  "kernel_dir": "$(jstr "$KDIR")",
  "kernel_version": "$KVER",
  "kernel_manifest_sha256": "$(sha256 "$KDIR/manifest.json")",
  "fio": {"path": "$(jstr "$FIO")", "version": "$(jstr "$FIO_VERSION")", "sha256": "$(sha256 "$FIO")"},
  "mpstat": $( [ -n "$MPSTAT" ] && echo true || echo false ),
  "mpstat_sha256": $MPSTAT_SHA,
  "dmsetup": $( [ -n "$DMSETUP" ] && echo true || echo false ),
  "dmsetup_sha256": $( [ -n "$DMSETUP" ] && echo "\"$(sha256 "$DMSETUP")\"" || echo null ),
  "busybox_sha256": "$(sha256 "$BUSYBOX")",
  "guest_scripts": $( [ -n "$GSCRIPTS" ] && echo true || echo false ),
  "guest_files_sha256": "$(guest_files_id)",
  "boot_modules": [$(json_list < "$R/blklab/modules")],
  "modules_available": {$AVAIL_JSON},
  "built_at": "$(utc_now)"
}
EOF
mv "$OUT.manifest.json.tmp" "$OUT.manifest.json"
echo "$HASH" > "$OUT.inputs-hash"
log "built $OUT ($(du -h "$OUT" | cut -f1), kernel $KVER, fio $FIO_VERSION$( [ -z "$MPSTAT" ] || echo ", mpstat")${AVAILABLE:+, modules:$AVAILABLE})"
