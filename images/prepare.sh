#!/bin/sh
# prepare.sh [--cache DIR] SPEC...
#
# Make each guest kernel SPEC ready to boot for the lab (docs/lab-protocol.md,
# section 1) and print one JSON object per SPEC, one a line, in order, on
# stdout (nothing else goes to stdout; progress goes to stderr):
#
#   {"spec":"build:6.12+noplug","name":"6.12-noplug","kernel":"/…/vmlinuz",
#    "initramfs":"/…/….cpio.gz","kernel_manifest":"/…/manifest.json",
#    "initramfs_manifest":"/…/….cpio.gz.manifest.json"}
#
# SPEC:
#   debian-6.1, debian-6.12   Debian's prebuilt kernel (fetch-debian-kernel.sh)
#   build:SERIES[+PATCH]      linux-source-SERIES + images/kernel/guest.config
#                             [+ images/patches/PATCH.patch] (build-kernel.sh)
#   path:FILE[,modules=DIR][,map=FILE][,name=LABEL]
#                             any bzImage; DIR is its lib/modules/KVER;
#                             FILE its System.map (default: System.map
#                             beside the image, or at the top of the tree
#                             for arch/x86/boot/bzImage), kept with the
#                             cached kernel for instruction counts
#
# The small fio (build-fio.sh) and mpstat (fetch-sysstat.sh) are built once
# and shared; each kernel gets its own initramfs (build-initramfs.sh) with
# them, the repository's guest-scripts/ and the kernel's modules.
#
# Cache: --cache DIR, else $BLKLAB_IMAGE_CACHE, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images. Every step is cached by a
# hash of its inputs, so a repeated call does nothing and prints the same
# paths. Environment: BLKLAB_ALLOW_NO_GUEST_SCRIPTS=1 builds images without
# guest-scripts/ (with a warning) instead of failing.
#
# Exit status non-zero with one last line `prepare: ERROR: …` naming the fix
# on any failure.
set -eu

LOG_NAME=prepare
USAGE="images/prepare.sh [--cache DIR] [--keys] SPEC...
  SPEC: debian-6.1 | debian-6.12 | build:SERIES[+PATCH] | path:FILE[,modules=DIR][,map=FILE][,name=LABEL]
  stdout: one JSON line per SPEC: spec, name, kernel, initramfs, kernel_manifest, initramfs_manifest
  --keys: build nothing; one JSON line per SPEC: spec, name, key, kernel_key,
          kernel_dir, initramfs, fio_key, mpstat_key (dirs relative to the cache)"
ARG_MISSING=error
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"

CACHE=""
KEYS_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
    --cache|--cache=*) opt_value "$@"; CACHE=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --keys) KEYS_ONLY=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) log "ERROR: unknown option: $1"; usage ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { log "ERROR: no SPEC given"; usage; }

REPO=$(cd "$HERE/.." && pwd)
GSCRIPTS="$REPO/guest-scripts"
CACHE=${CACHE:-$(image_cache)}

need_tools "apt-get install coreutils util-linux" sh sha256sum od dd flock mktemp tee

abspath() {  # abspath PATH: absolute path (the file need not exist; its dir must)
    case "$1" in
    /*) p=$1 ;;
    *) p="$(pwd)/$1" ;;
    esac
    d=$(cd "$(dirname "$p")" 2>/dev/null && pwd) || { echo "$p"; return 0; }
    echo "$d/$(basename "$p")"
}
is_bzimage() { [ "$(dd if="$1" bs=1 skip=514 count=4 2>/dev/null)" = HdrS ]; }
bzimage_version() {  # the version string of a bzImage's setup header (first word)
    off=$(od -An -tu2 -j 526 -N 2 "$1" 2>/dev/null | tr -d ' \n')
    [ -n "$off" ] && [ "$off" -gt 0 ] || return 0
    dd if="$1" bs=1 skip=$((off + 512)) count=200 2>/dev/null | tr '\0' '\n' | head -n1 | cut -d' ' -f1
}

# --- parse and check every SPEC before doing anything slow ---------------------------------
# path_kernel_map FILE: the System.map of a path: kernel FILE: map=FILE,
# else System.map beside the image, else at the top of the tree for
# .../arch/x86/boot/bzImage; empty when there is none.
path_kernel_map() {
    if [ -n "$MAPF" ]; then abspath "$MAPF"; return 0; fi
    d=$(dirname "$1")
    if [ -f "$d/System.map" ]; then abspath "$d/System.map"; return 0; fi
    case "$1" in
    */arch/x86/boot/bzImage)
        top=${1%/arch/x86/boot/bzImage}
        if [ -f "$top/System.map" ]; then abspath "$top/System.map"; fi ;;
    esac
}

# spec_kernel: for the parsed SPEC, KDIR (its kernel directory in the
# cache) and KKEY (the kernel's key, images/lib.sh): offline, before
# building. A path: kernel's key is the sha256 of its bzImage, joined by
# its modules dir and the sha256 of its System.map when it has them (a bare
# image's key stays its sha256: caches made before maps were kept stay
# valid); it also sets KSRC, KSHA, KMAP, KMAPSHA, KMODS for
# prepare_path_kernel.
spec_kernel() {
    case "$KIND" in
    debian)
        KDIR="$CACHE/kernel-$SERIES"
        KKEY=$(key_debian_kernel "$SERIES")
        ;;
    build)
        KDIR="$CACHE/kernel-build-$SERIES${PATCHN:++$PATCHN}"
        KKEY=$(key_build_kernel "$SERIES" "$PATCHN")
        ;;
    path)
        KSRC=$(abspath "$KFILE")
        KSHA=$(sha256 "$KSRC")
        KMAP=$(path_kernel_map "$KSRC")
        KMAPSHA=""
        [ -z "$KMAP" ] || KMAPSHA=$(sha256 "$KMAP")
        KMODS=""
        [ -z "$MODS" ] || KMODS=$(cd "$MODS" && pwd)
        KKEY=$KSHA
        if [ -n "$KMODS$KMAPSHA" ]; then
            KKEY=$(printf '%s %s %s\n' "$KSHA" "$KMODS" "$KMAPSHA" | sha256)
        fi
        KDIR="$CACHE/kernel-path-$(echo "$KKEY" | cut -c1-16)"
        ;;
    esac
}

# parse_spec SPEC sets KIND (debian|build|path), SERIES, PATCHN, KFILE, MODS, NAME.
parse_spec() {
    KIND=""; SERIES=""; PATCHN=""; KFILE=""; MODS=""; MAPF=""; NAME=""
    case "$1" in
    debian-*)
        KIND=debian; SERIES=${1#debian-}; NAME=$1
        case "$SERIES" in
        6.1|6.12) ;;
        *) die "$1: Debian kernels are debian-6.1 and debian-6.12" ;;
        esac
        ;;
    build:*)
        KIND=build; rest=${1#build:}
        SERIES=${rest%%+*}
        [ "$SERIES" = "$rest" ] || PATCHN=${rest#*+}
        expr "x$SERIES" : 'x[0-9][0-9]*\.[0-9][0-9]*$' >/dev/null \
            || die "$1: expected build:SERIES[+PATCH] with SERIES like 6.12"
        if [ "$SERIES" = "$rest" ]; then
            NAME=$SERIES
        else
            case "$PATCHN" in
            ''|*[!A-Za-z0-9_-]*) die "$1: PATCH must name images/patches/PATCH.patch (letters, digits, _ -)" ;;
            esac
            [ -f "$HERE/patches/$PATCHN.patch" ] || die "$1: no patch images/patches/$PATCHN.patch (available: $(patch_names))"
            NAME="$SERIES-$PATCHN"
        fi
        ;;
    path:*|*/*)
        KIND=path; body=${1#path:}
        KFILE=${body%%,*}
        opts=""
        [ "$KFILE" = "$body" ] || opts=${body#*,}
        [ -n "$KFILE" ] || die "$1: empty kernel path (path:FILE[,modules=DIR][,map=FILE][,name=LABEL])"
        while [ -n "$opts" ]; do
            o=${opts%%,*}
            if [ "$o" = "$opts" ]; then opts=""; else opts=${opts#*,}; fi
            case "$o" in
            modules=?*) MODS=${o#modules=} ;;
            map=?*) MAPF=${o#map=} ;;
            name=?*) NAME=${o#name=}
                case "$NAME" in *[!A-Za-z0-9._+-]*) die "$1: name=$NAME: use letters, digits and . _ + -" ;; esac ;;
            *) die "$1: unknown option '$o' (modules=DIR, map=FILE, name=LABEL)" ;;
            esac
        done
        [ -e "$KFILE" ] || die "$1: kernel image $KFILE does not exist"
        [ -f "$KFILE" ] || die "$1: kernel image $KFILE is not a file"
        is_bzimage "$KFILE" || die "$1: $KFILE is not a bzImage (no \"HdrS\" boot header at offset 0x202; use arch/x86/boot/bzImage)"
        if [ -n "$MAPF" ]; then
            [ -f "$MAPF" ] || die "$1: map=$MAPF: no such file (the System.map of that kernel build)"
        fi
        if [ -n "$MODS" ]; then
            [ -d "$MODS" ] || die "$1: modules directory $MODS does not exist (give the lib/modules/KVER of that kernel)"
            [ -f "$MODS/modules.dep" ] || [ -d "$MODS/kernel" ] \
                || die "$1: $MODS does not look like lib/modules/KVER (no modules.dep, no kernel/); run make modules_install INSTALL_MOD_PATH=..."
        fi
        if [ -z "$NAME" ]; then
            NAME=$(basename "$KFILE" | tr -c 'A-Za-z0-9._+\n-' '_')
        fi
        ;;
    *)
        die "$1: unknown SPEC (expected debian-6.1, debian-6.12, build:5.10[+PATCH], build:6.12[+PATCH] or path:FILE[,modules=DIR][,map=FILE][,name=LABEL])"
        ;;
    esac
}

NAMES=" "
for spec in "$@"; do
    parse_spec "$spec"
    case "$NAMES" in
    *" $NAME "*) die "two SPECs are named '$NAME'; give one a name (path:FILE,name=LABEL) or drop the duplicate" ;;
    esac
    NAMES="$NAMES$NAME "
    # Fail fast on a series Debian does not ship, unless the kernel is in
    # the cache under its key already (then no apt at all).
    if [ "$KIND" = build ] && [ "$KEYS_ONLY" = 0 ]; then
        spec_kernel
        ! kernel_cached "$KDIR" "$KKEY" || continue
    fi
    if [ "$KIND" = build ] && [ "$KEYS_ONLY" = 0 ] && command -v apt-cache >/dev/null 2>&1; then
        # Fail fast on a series Debian does not ship.
        avail=$(source_series)
        if [ -z "$avail" ] && is_root; then
            log "apt lists missing; running apt-get update"
            apt-get update -qq >&2 || die "apt-get update failed (check the network and /etc/apt/sources.list.d)"
            avail=$(source_series)
        fi
        if [ -n "$avail" ]; then
            case " $avail " in
            *" $SERIES "*) ;;
            *) die "$spec: Debian has no linux-source-$SERIES here (series available: $avail); $(source_hint "$SERIES")" ;;
            esac
        fi
    fi
done

if [ ! -d "$GSCRIPTS" ]; then
    if [ "${BLKLAB_ALLOW_NO_GUEST_SCRIPTS:-0}" = 1 ]; then
        log "WARNING: $GSCRIPTS is missing: the images get no guest-scripts (/blklab/lab will fail in the guest)"
        GSCRIPTS=""
    else
        die "$GSCRIPTS is missing (the lab's guest side); restore it, or set BLKLAB_ALLOW_NO_GUEST_SCRIPTS=1 to build images without it"
    fi
elif [ ! -f "$GSCRIPTS/lab.sh" ]; then
    if [ "${BLKLAB_ALLOW_NO_GUEST_SCRIPTS:-0}" = 1 ]; then
        log "WARNING: $GSCRIPTS has no lab.sh (/blklab/lab will fail in the guest)"
    else
        die "$GSCRIPTS has no lab.sh (the guest entry point); restore it, or set BLKLAB_ALLOW_NO_GUEST_SCRIPTS=1"
    fi
fi

# --keys: each SPEC's key (the key of its initramfs, which covers its
# kernel's, fio's and mpstat's keys and the guest scripts) and where its
# artifacts live in the cache; nothing is built, no apt, no network.
if [ "$KEYS_ONLY" = 1 ]; then
    FIOKEY=$(key_fio)
    MPKEY=$(key_mpstat)
    for spec in "$@"; do
        parse_spec "$spec"
        spec_kernel
        key=$(key_initramfs "key $KKEY" "key $FIOKEY" "key $MPKEY" "$GSCRIPTS" "")
        kd=$(basename "$KDIR")
        printf '{"spec":"%s","name":"%s","key":"%s","kernel_key":"%s","kernel_dir":"%s","initramfs":"initramfs/%s.cpio.gz","fio_key":"%s","mpstat_key":"%s"}\n' \
            "$(jstr "$spec")" "$(jstr "$NAME")" "$key" "$KKEY" "$kd" "$kd" "$FIOKEY" "$MPKEY"
    done
    exit 0
fi

mkdir -p "$CACHE" || die "cannot create the cache directory $CACHE (choose another with --cache DIR)"
CACHE=$(cd "$CACHE" && pwd)
work_dir prepare

# One prepare.sh at a time per cache: the steps share output paths.
exec 8>"$CACHE/.prepare.lock"
if ! flock -n 8; then
    log "waiting for another prepare.sh using $CACHE"
    flock 8
fi

# run_step WHAT CMD...: run CMD, its stdout and stderr both to our stderr (and
# a copy kept); on failure die with the step's own last ERROR line.
run_step() {
    what=$1; shift
    rm -f "$WORK/step.rc"
    { "$@" </dev/null 2>&1 && echo 0 > "$WORK/step.rc" || echo $? > "$WORK/step.rc"; } \
        | tee "$WORK/step.log" >&2
    rc=$(cat "$WORK/step.rc" 2>/dev/null || echo 1)
    if [ "$rc" != 0 ]; then
        msg=$(grep 'ERROR:' "$WORK/step.log" | tail -n1 | sed 's/^.*ERROR: *//')
        die "$what: ${msg:-$(basename "$2") failed with exit status $rc (see the messages above)}"
    fi
}

# --- shared tools: the small fio and mpstat -----------------------------------------------
T0=$(date +%s)
FIODIR="$CACHE/tools/fio"
SYSSTATDIR="$CACHE/tools/sysstat"
run_step "small fio (images/build-fio.sh)" sh "$HERE/build-fio.sh" --out "$FIODIR"
run_step "mpstat (images/fetch-sysstat.sh)" sh "$HERE/fetch-sysstat.sh" --out "$SYSSTATDIR"

# --- kernels and their initramfs ---------------------------------------------------------
# prepare_path_kernel: lay out KDIR for a path: SPEC (vmlinuz copy, its
# System.map, modules symlink, manifest), after spec_kernel.
prepare_path_kernel() {
    src=$KSRC; ksha=$KSHA; map=$KMAP; msha=$KMAPSHA; mods_abs=$KMODS
    [ -n "$map" ] || log "note: no System.map beside $src (give path:...,map=FILE): no instruction counts per function for it"
    if [ -f "$KDIR/manifest.json" ] && [ -f "$KDIR/vmlinuz" ] \
       && [ "$(json_field "$KDIR/manifest.json" vmlinuz_sha256)" = "$ksha" ] \
       && [ "$(json_field "$KDIR/manifest.json" inputs_hash)" = "$KKEY" ] \
       && [ "$(sha256 "$KDIR/vmlinuz")" = "$ksha" ] \
       && { [ -z "$msha" ] || [ "$(sha256 "$KDIR/System.map" 2>/dev/null)" = "$msha" ]; }; then
        log "cached: $KDIR ($(json_field "$KDIR/manifest.json" kernel_version))"
        return 0
    fi
    rm -rf "$KDIR"
    mkdir -p "$KDIR"
    cp "$src" "$KDIR/vmlinuz"
    [ -z "$map" ] || cp "$map" "$KDIR/System.map"
    kver=$(bzimage_version "$src")
    if [ -n "$mods_abs" ]; then
        mkdir -p "$KDIR/lib/modules"
        ln -s "$mods_abs" "$KDIR/lib/modules/$(basename "$mods_abs")"
        [ -n "$kver" ] || kver=$(basename "$mods_abs")
        if [ "$kver" != "$(basename "$mods_abs")" ]; then
            log "WARNING: $KFILE says it is $kver but the modules are for $(basename "$mods_abs")"
        fi
    fi
    mods_json=null
    [ -z "$mods_abs" ] || mods_json="\"$(jstr "$mods_abs")\""
    map_json=null; msha_json=null
    if [ -n "$map" ]; then map_json="\"$(jstr "$map")\""; msha_json="\"$msha\""; fi
    cat > "$KDIR/manifest.json" <<EOF
{
  "kind": "path",
  "series": null,
  "kernel_version": "$(jstr "${kver:-unknown}")",
  "source_path": "$(jstr "$src")",
  "modules_dir": $mods_json,
  "source_package": null,
  "source_version": null,
  "config_sha256": null,
  "patch": null,
  "vmlinuz_sha256": "$ksha",
  "inputs_hash": "$KKEY",
  "system_map": $map_json,
  "system_map_sha256": $msha_json,
  "prepared_at": "$(utc_now)"
}
EOF
    log "path kernel $src -> $KDIR (kernel ${kver:-unknown}${mods_abs:+, modules $mods_abs})"
}

mkdir -p "$CACHE/initramfs"
: > "$WORK/out.jsonl"
for spec in "$@"; do
    parse_spec "$spec"
    log "=== $spec ($NAME)"
    spec_kernel
    case "$KIND" in
    debian)
        run_step "$spec" sh "$HERE/fetch-debian-kernel.sh" "$SERIES" "$KDIR"
        ;;
    build)
        if [ -n "$PATCHN" ]; then
            run_step "$spec" sh "$HERE/build-kernel.sh" --series "$SERIES" --patch "$PATCHN" \
                --out "$KDIR" --cache "$CACHE/kernel-src"
        else
            run_step "$spec" sh "$HERE/build-kernel.sh" --series "$SERIES" \
                --out "$KDIR" --cache "$CACHE/kernel-src"
        fi
        ;;
    path)
        prepare_path_kernel
        ;;
    esac
    { [ -f "$KDIR/vmlinuz" ] && [ -f "$KDIR/manifest.json" ]; } || die "$spec: $KDIR has no vmlinuz/manifest.json after preparing it"
    INITRD="$CACHE/initramfs/$(basename "$KDIR").cpio.gz"
    if [ -n "$GSCRIPTS" ]; then
        run_step "$spec: initramfs" sh "$HERE/build-initramfs.sh" --kernel-dir "$KDIR" --out "$INITRD" \
            --fio "$FIODIR/fio" --mpstat "$SYSSTATDIR/mpstat" --guest-scripts "$GSCRIPTS"
    else
        run_step "$spec: initramfs" sh "$HERE/build-initramfs.sh" --kernel-dir "$KDIR" --out "$INITRD" \
            --fio "$FIODIR/fio" --mpstat "$SYSSTATDIR/mpstat"
    fi
    # The caller boots a snapshot named by content, not $INITRD itself: another
    # prepare.sh (a run from another source tree, with other guest scripts,
    # sharing this cache) may rebuild $INITRD while the caller's guests still
    # boot. build-initramfs.sh replaces $INITRD with mv, so a hard link keeps
    # this content; the manifest is copied.
    SNAPDIR="$CACHE/initramfs/snapshots"
    mkdir -p "$SNAPDIR"
    SNAP="$SNAPDIR/$(basename "$KDIR").$(sha256 "$INITRD" | cut -c1-16).cpio.gz"
    ln -f "$INITRD" "$SNAP" 2>/dev/null || cp "$INITRD" "$SNAP" || die "cannot write $SNAP"
    cp "$INITRD.manifest.json" "$SNAP.manifest.json" || die "cannot write $SNAP.manifest.json"
    touch "$SNAP" "$SNAP.manifest.json"
    printf '{"spec":"%s","name":"%s","kernel":"%s","initramfs":"%s","kernel_manifest":"%s","initramfs_manifest":"%s"}\n' \
        "$(jstr "$spec")" "$(jstr "$NAME")" "$(jstr "$KDIR/vmlinuz")" "$(jstr "$SNAP")" \
        "$(jstr "$KDIR/manifest.json")" "$(jstr "$SNAP.manifest.json")" >> "$WORK/out.jsonl"
done

# Snapshots not prepared for a week are no run's any more.
find "$CACHE/initramfs/snapshots" -type f -mtime +7 -delete 2>/dev/null
log "ready: $# kernel(s) in $(( $(date +%s) - T0 ))s"
cat "$WORK/out.jsonl"
