#!/bin/sh
# run.sh [-o OUTDIR] [--check] SCENARIO [DEV...]
#
# Runs one blklab scenario in a guest and prints one result document per
# variant, as specified in docs/lab-protocol.md (section 3); see
# guest-scripts/README.md for running it by hand.
#
#   SCENARIO    a name (scenarios/NAME.scn next to this script) or a path
#   DEV...      block devices (names or /dev paths) for `target virtio`
#               variants; default: every /sys/block/vd* not in use (mounted,
#               swap, holders), waiting up to 20 s for `disks` of them
#   -o OUTDIR   also write each document to OUTDIR/SCENARIO.VARIANT.json
#   --check     only parse and validate SCENARIO; print it as one JSON line
#
# Environment: BLKLAB_RUNTIME, BLKLAB_RAMP (seconds, override the scenario),
# BLKLAB_VARIANTS (comma list: run only these), BLKLAB_SYNC=1 (host
# handshake), BLKLAB_SYNC_TIMEOUT (seconds, default 120), BLKLAB_DISK_WAIT
# (seconds to wait for devices, default 20), BLKLAB_KEEP=DIR (keep each
# variant's snapshots and raw output in DIR/SCENARIO.VARIANT/), AWK (default
# awk; "busybox awk" works).
#
# Exit status: 0 all variants ok, 1 a variant failed, 2 usage or scenario
# error (nothing was run).
#
# This file parses the arguments and the scenario and runs the variants,
# each as the steps of run_variant; the steps' parts are the files of lib/
# sourced below (target devices, dm stacks, queue settings, blk-mq debugfs,
# the SYNC handshake, the measured window), each opening with what it
# provides, what it expects of this file and what it must not do.
#
# POSIX sh: runs under busybox ash (the blklab initramfs), dash and bash.
# sysfs names are plain, so `ls` output is safe to split (and pathname
# expansion is off for everything the scenario supplies).

HERE=$(cd "$(dirname "$0")" && pwd)
LIB=$HERE/lib
AWK=${AWK:-awk}
DISK_WAIT=${BLKLAB_DISK_WAIT:-20}
SYNC_TIMEOUT=${BLKLAB_SYNC_TIMEOUT:-120}

# shellcheck source=guest-scripts/lib/common.sh
. "$LIB/common.sh"
# shellcheck source=guest-scripts/lib/sync.sh
. "$LIB/sync.sh"
# shellcheck source=guest-scripts/lib/virtio.sh
. "$LIB/virtio.sh"
# shellcheck source=guest-scripts/lib/modules.sh
. "$LIB/modules.sh"
# shellcheck source=guest-scripts/lib/stack.sh
. "$LIB/stack.sh"
# shellcheck source=guest-scripts/lib/queue.sh
. "$LIB/queue.sh"
# shellcheck source=guest-scripts/lib/blkmq.sh
. "$LIB/blkmq.sh"
# shellcheck source=guest-scripts/lib/measure.sh
. "$LIB/measure.sh"

usage() {
    echo "usage: run.sh [-o OUTDIR] [--check] SCENARIO [DEV...]" >&2
    exit 2
}

OUTDIR=""
CHECK=0
while [ $# -gt 0 ]; do
    case $1 in
    -o) [ $# -ge 2 ] || usage; OUTDIR=$2; shift 2 ;;
    -o*) OUTDIR=${1#-o}; shift ;;
    --check) CHECK=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "run.sh: unknown option $1" >&2; usage ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || usage
SCN_ARG=$1
shift

case $SCN_ARG in
*/*|*.scn) SCN_PATH=$SCN_ARG ;;
*) SCN_PATH=$HERE/scenarios/$SCN_ARG.scn ;;
esac
if [ ! -f "$SCN_PATH" ]; then
    echo "BLKLAB-ERROR scenario $SCN_PATH: no such scenario file"
    exit 2
fi
SCN_NAME=$(basename "$SCN_PATH" .scn)

if [ "$CHECK" = 1 ]; then
    SCN_FILE=$SCN_PATH SCN_NAME=$SCN_NAME \
        $AWK -v mode=json -f "$LIB/json.awk" -f "$LIB/scenario.awk" "$SCN_PATH"
    exit $?
fi

# From here on no pathname expansion: words from the scenario are split, never globbed.
set -f

NCPU=$(grep -c '^cpu[0-9]' /proc/stat)
PARSED=$(SCN_FILE=$SCN_PATH SCN_NAME=$SCN_NAME \
    $AWK -v mode=sh -v ncpu="$NCPU" -f "$LIB/json.awk" -f "$LIB/scenario.awk" "$SCN_PATH")
rc=$?
if [ $rc -ne 0 ]; then
    [ -n "$PARSED" ] && printf '%s\n' "$PARSED"
    exit 2
fi
eval "$PARSED"

case $DISK_WAIT in ''|*[!0-9]*) echo "BLKLAB-ERROR BLKLAB_DISK_WAIT=$DISK_WAIT: bad number"; exit 2 ;; esac
case $SYNC_TIMEOUT in ''|*[!0-9]*) echo "BLKLAB-ERROR BLKLAB_SYNC_TIMEOUT=$SYNC_TIMEOUT: bad number"; exit 2 ;; esac
if ! command -v fio >/dev/null 2>&1; then
    echo "BLKLAB-ERROR $SCN_NAME: fio not found in PATH"
    exit 2
fi
if [ -n "$OUTDIR" ] && ! mkdir -p "$OUTDIR"; then
    echo "BLKLAB-ERROR $SCN_NAME: cannot create $OUTDIR"
    exit 2
fi

KERNEL=$(uname -r)
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/blklab-run.XXXXXX") || { echo "BLKLAB-ERROR $SCN_NAME: mktemp failed"; exit 2; }

# --- tty and cleanup -----------------------------------------------------------
# shellcheck disable=SC2317  # run by the traps below
cleanup() {
    console_restore
    [ -n "$TMPD" ] && rm -rf "$TMPD"
    TMPD=""
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
console_quiet

# --- one variant ----------------------------------------------------------------
# shellcheck disable=SC2153  # the V* variables are set by the evals below
variant_begin() {   # variant_begin INDEX: the variant's settings (V*), a clean state, W
    eval "VNAME=\$SCN_V$1_NAME VKIND=\$SCN_V$1_KIND VPARAMS=\$SCN_V$1_PARAMS VSCHED=\$SCN_V$1_SCHED"
    eval "VNR=\$SCN_V$1_NR VRUNTIME=\$SCN_V$1_RUNTIME VRAMP=\$SCN_V$1_RAMP VFIO=\$SCN_V$1_FIO"
    eval "VQDEPTH=\$SCN_V$1_QDEPTH VNOMERGES=\$SCN_V$1_NOMERGES VRQAFF=\$SCN_V$1_RQAFF VLAYOUT=\$SCN_V$1_LAYOUT"
    eval "VSTACK=\$SCN_V$1_STACK VSTACKP=\$SCN_V$1_STACKP"
    ERR=""
    DEVS=""
    SAVED_Q=""
    W=$TMPD/v$1
    mkdir -p "$W"
    R_PATHS=""; R_PATH_QUEUE=""
    R_QUEUE=""; R_BEFORE=""; R_AFTER=""; R_BEFORE_EDGE=""; R_AFTER_EDGE=""; R_MPSTAT=""; R_FIO=""; R_FIO_RC=""; R_FIO_LOG=""; R_FIOCMD=""
}

# shellcheck disable=SC2153  # the V* variables are set by variant_begin
targets_up() {      # DEVS: the variant's target devices
    case $VKIND in
    virtio)
        find_virtio
        if [ -n "$VIRTIO_ERR" ]; then fail "$VIRTIO_ERR"; else DEVS=$VIRTIO_DEVS; fi ;;
    scsi_debug|null_blk)
        load_module "$VKIND" "$VPARAMS" ;;
    *)  fail "unknown target $VKIND" ;;
    esac
    if [ -z "$ERR" ] && [ -z "$DEVS" ]; then fail "no target devices"; fi
}

teardown() {        # undo the variant's setup, last step first; R_DEVICES: what fio ran on
    restore_queue
    R_DEVICES=$DEVS
    remove_stack
    unload_module
}

# shellcheck disable=SC2153  # the V* variables are set by variant_begin
variant_result() {  # the document on stdout between its markers, and in OUTDIR and BLKLAB_KEEP
    if [ -z "$ERR" ]; then R_OK=true; else R_OK=false; fi
    R_CLOCKSOURCE=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)
    export R_SCENARIO="$SCN_NAME" R_VARIANT="$VNAME" R_OK R_ERROR="$ERR" R_KERNEL="$KERNEL" \
        R_NCPU="$NCPU" R_CLOCKSOURCE R_KIND="$VKIND" R_PARAMS="$VPARAMS" R_SCHED="$VSCHED" R_NR="$VNR" \
        R_QDEPTH="$VQDEPTH" R_NOMERGES="$VNOMERGES" R_RQAFF="$VRQAFF" R_LAYOUT="$VLAYOUT" \
        R_STACK="$VSTACK" R_STACKP="$VSTACKP" R_PATHS R_PATH_QUEUE \
        R_RUNTIME="$VRUNTIME" R_RAMP="$VRAMP" R_FIOARGS="$VFIO" R_FIOCMD R_DEVICES \
        R_QUEUE R_BEFORE R_AFTER R_BEFORE_EDGE R_AFTER_EDGE R_MPSTAT R_FIO R_FIO_RC R_FIO_LOG R_BLKMQ_ERROR="$BLKMQ_ERR"
    $AWK -f "$LIB/json.awk" -f "$LIB/cpu.awk" -f "$LIB/blkmq.awk" -f "$LIB/result.awk" > "$W/result.json"
    echo "BLKLAB-RESULT-BEGIN $SCN_NAME $VNAME"
    cat "$W/result.json"
    echo "BLKLAB-RESULT-END $SCN_NAME $VNAME"
    if [ -n "$OUTDIR" ]; then
        cp "$W/result.json" "$OUTDIR/$SCN_NAME.$VNAME.json" || \
            echo "BLKLAB-ERROR $SCN_NAME $VNAME: cannot write $OUTDIR/$SCN_NAME.$VNAME.json"
    fi
    if [ -n "$BLKLAB_KEEP" ]; then     # debugging: keep snapshots, fio and mpstat output
        mkdir -p "$BLKLAB_KEEP/$SCN_NAME.$VNAME" && cp -R "$W"/. "$BLKLAB_KEEP/$SCN_NAME.$VNAME/"
    fi
    rm -rf "$W"
}

run_variant() {     # run_variant INDEX: its document printed; 0 when it ran without error
    variant_begin "$1"
    targets_up
    if [ -z "$ERR" ] && [ -n "$VSTACK" ]; then stack_up; fi
    if [ -z "$ERR" ] && apply_queue; then
        R_QUEUE=$(queue_json)
        measure
    fi
    teardown
    variant_result
    [ -z "$ERR" ]
}

# --- main -----------------------------------------------------------------------
EXPLICIT_DEVS=""
for _a; do
    _a=${_a#/dev/}
    EXPLICIT_DEVS="$EXPLICIT_DEVS $_a"
done
EXPLICIT_DEVS=${EXPLICIT_DEVS# }

status=0
i=1
while [ "$i" -le "$SCN_NV" ]; do
    run_variant "$i" || status=1
    i=$((i + 1))
done
exit $status
