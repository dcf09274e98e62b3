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
# POSIX sh: runs under busybox ash (the blklab initramfs), dash and bash.
# `read -t` is used only where the shell has it (busybox, bash), else
# timeout(1); sysfs names are plain, so `ls` output is safe to split (and
# pathname expansion is off for everything the scenario supplies).

HERE=$(cd "$(dirname "$0")" && pwd)
LIB=$HERE/lib
AWK=${AWK:-awk}
MODDIR=${BLKLAB_MODULE_DIR:-/lib/modules/blklab}
MODAVAIL=${BLKLAB_MODULES_AVAILABLE:-/blklab/modules-available}
DISK_WAIT=${BLKLAB_DISK_WAIT:-20}
SYNC_TIMEOUT=${BLKLAB_SYNC_TIMEOUT:-120}

usage() {
    echo "usage: run.sh [-o OUTDIR] [--check] SCENARIO [DEV...]" >&2
    exit 2
}
say() { echo "run.sh: $*" >&2; }     # diagnostics (not protocol lines)

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
STTY_SAVED=""
# shellcheck disable=SC2317  # run by the traps below
cleanup() {
    if [ -n "$STTY_SAVED" ]; then
        stty "$STTY_SAVED" 2>/dev/null
        STTY_SAVED=""
    fi
    [ -n "$TMPD" ] && rm -rf "$TMPD"
    TMPD=""
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

if [ "$BLKLAB_SYNC" = 1 ] && [ -t 0 ] && command -v stty >/dev/null 2>&1; then
    # The host's replies must not be echoed back onto the console output.
    STTY_SAVED=$(stty -g 2>/dev/null) && stty -echo 2>/dev/null || STTY_SAVED=""
fi

# --- small helpers -------------------------------------------------------------
uptime_cs() {   # /proc/uptime in centiseconds
    read -r _uc_u _uc_rest < /proc/uptime
    _uc_i=${_uc_u%.*}
    _uc_f=${_uc_u#*.}
    echo $(( _uc_i * 100 + ${_uc_f#0} ))
}

# is_in_use NAME: the disk or one of its partitions is mounted, swap or held
is_in_use() {
    _iu_d=$1
    _iu_names=$_iu_d
    _iu_devs=$(cat "/sys/block/$_iu_d/dev" 2>/dev/null)
    # shellcheck disable=SC2045  # sysfs names are plain
    for _iu_p in $(ls "/sys/block/$_iu_d" 2>/dev/null); do
        if [ -f "/sys/block/$_iu_d/$_iu_p/partition" ]; then
            _iu_names="$_iu_names $_iu_p"
            _iu_devs="$_iu_devs $(cat "/sys/block/$_iu_d/$_iu_p/dev" 2>/dev/null)"
        fi
    done
    for _iu_n in $_iu_names; do
        if [ -n "$(ls "/sys/class/block/$_iu_n/holders" 2>/dev/null)" ]; then return 0; fi
    done
    # /proc/self/mountinfo field 3 is MAJ:MIN; /proc/mounts and /proc/swaps name /dev/X
    # shellcheck disable=SC2016  # an awk program
    $AWK -v names="$_iu_names" -v devs="$_iu_devs" '
        BEGIN { n = split(names, a, " "); for (i = 1; i <= n; i++) nm["/dev/" a[i]] = 1
                n = split(devs, b, " "); for (i = 1; i <= n; i++) dv[b[i]] = 1 }
        FILENAME ~ /mountinfo$/ { if ($3 in dv) found = 1; next }
        { if ($1 in nm) found = 1 }
        END { exit found ? 0 : 1 }' /proc/self/mountinfo /proc/mounts /proc/swaps 2>/dev/null
}

# sorted like the kernel names them: vda..vdz, vdaa..
sort_devs() {
    # shellcheck disable=SC2016  # awk programs
    $AWK '{ printf "%d %s\n", length($0), $0 }' | sort -k1,1n -k2,2 | $AWK '{ print $2 }'
}

list_vd() {
    # shellcheck disable=SC2010  # sysfs names are plain
    ls /sys/block 2>/dev/null | grep '^vd[a-z]*$' | sort_devs
}

# --- SYNC handshake -----------------------------------------------------------
# shellcheck disable=SC3045  # probing whether this shell has read -t
if (echo x | read -r -t 1 _x) 2>/dev/null; then HAVE_READ_T=1; else HAVE_READ_T=0; fi

next_seq() {    # per-boot counter shared by every run.sh of this boot
    _ns_boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)
    _ns_f=${BLKLAB_SYNC_SEQ_FILE:-}
    if [ -z "$_ns_f" ]; then
        if [ -d /run ] && [ -w /run ]; then _ns_f=/run/blklab-sync-seq; else _ns_f=/tmp/blklab-sync-seq; fi
    fi
    _ns_n=0
    if [ -f "$_ns_f" ]; then
        read -r _ns_fb _ns_fn < "$_ns_f"
        [ "$_ns_fb" = "$_ns_boot" ] && _ns_n=$_ns_fn
    fi
    _ns_n=$((_ns_n + 1))
    echo "$_ns_boot $_ns_n" > "$_ns_f"
    echo "$_ns_n"
}

# read_line SECS: one line of stdin into LINE; 0 ok, 1 end of input, 2 timeout
read_line() {
    LINE=""
    _rl_t0=$(uptime_cs)
    if [ "$HAVE_READ_T" = 1 ]; then
        # shellcheck disable=SC3045  # only where the shell has read -t
        IFS= read -r -t "$1" LINE && return 0
        _rl_rc=$?
    elif command -v timeout >/dev/null 2>&1; then
        # shellcheck disable=SC2016  # a script for the inner sh
        LINE=$(timeout "$1" sh -c 'IFS= read -r l && printf "%s." "$l"')
        _rl_rc=$?
        case $LINE in *.) LINE=${LINE%.}; return 0 ;; esac
    else
        IFS= read -r LINE && return 0
        return 1
    fi
    [ "$_rl_rc" -gt 128 ] && return 2
    # busybox returns 1 for both: tell them apart by the time spent
    [ $(( $(uptime_cs) - _rl_t0 )) -ge $(( $1 * 100 - 50 )) ] && return 2
    return 1
}

# sync_point WHAT: print the SYNC line and wait for the host's reply
sync_point() {
    [ "$BLKLAB_SYNC" = 1 ] || return 0
    _sp_n=$(next_seq)
    echo "BLKLAB-SYNC $_sp_n $1 $SCN_NAME $VNAME"
    _sp_deadline=$(( $(uptime_cs) + SYNC_TIMEOUT * 100 ))
    while :; do
        _sp_left=$(( (_sp_deadline - $(uptime_cs) + 99) / 100 ))
        if [ "$_sp_left" -le 0 ]; then
            fail "no reply to BLKLAB-SYNC $_sp_n ($1) within $SYNC_TIMEOUT s"
            return 1
        fi
        read_line "$_sp_left"
        case $? in
        0)  _sp_got=$(printf '%s' "$LINE" | tr -d ' \t\r')
            [ "$_sp_got" = "$_sp_n" ] && return 0
            say "ignoring console input '$_sp_got' while waiting for SYNC reply $_sp_n" ;;
        1)  fail "end of input while waiting for the reply to BLKLAB-SYNC $_sp_n ($1)"
            return 1 ;;
        *)  fail "no reply to BLKLAB-SYNC $_sp_n ($1) within $SYNC_TIMEOUT s"
            return 1 ;;
        esac
    done
}

# --- per-variant error state --------------------------------------------------
fail() {    # record (first one wins the "error" slot) and print an error
    echo "BLKLAB-ERROR $SCN_NAME $VNAME: $*"
    if [ -z "$ERR" ]; then ERR=$*; else ERR="$ERR; $*"; fi
}

# --- virtio devices -------------------------------------------------------------
VIRTIO_DEVS=""
VIRTIO_DONE=0
VIRTIO_ERR=""
find_virtio() {     # once per run: sets VIRTIO_DEVS or VIRTIO_ERR
    [ "$VIRTIO_DONE" = 1 ] && return
    VIRTIO_DONE=1
    _fv_end=$(( $(uptime_cs) + DISK_WAIT * 100 ))
    if [ -n "$EXPLICIT_DEVS" ]; then
        for _fv_d in $EXPLICIT_DEVS; do
            while [ ! -e "/sys/block/$_fv_d" ] && [ "$(uptime_cs)" -lt "$_fv_end" ]; do sleep 1; done
            if [ ! -e "/sys/block/$_fv_d" ]; then
                VIRTIO_ERR="device $_fv_d not found (no /sys/block/$_fv_d; whole disks only)"
                return
            fi
            if is_in_use "$_fv_d"; then
                VIRTIO_ERR="device $_fv_d is in use (mounted, swap or held); refusing to run fio on it"
                return
            fi
        done
        VIRTIO_DEVS=$EXPLICIT_DEVS
    else
        while :; do
            _fv_all=$(list_vd)
            _fv_free=""
            _fv_n=0
            for _fv_d in $_fv_all; do
                if is_in_use "$_fv_d"; then continue; fi
                _fv_free="$_fv_free $_fv_d"
                _fv_n=$((_fv_n + 1))
            done
            [ "$_fv_n" -ge "$SCN_DISKS" ] && break
            [ "$(uptime_cs)" -lt "$_fv_end" ] || break
            sleep 1
        done
        _fv_skipped=""
        for _fv_d in $_fv_all; do case " $_fv_free " in *" $_fv_d "*) ;; *) _fv_skipped="$_fv_skipped $_fv_d" ;; esac; done
        [ -n "$_fv_skipped" ] && say "skipping virtio disks in use (mounted, swap or held):$_fv_skipped"
        if [ "$_fv_n" -lt "$SCN_DISKS" ]; then
            VIRTIO_ERR="found $_fv_n usable virtio disk(s) after $DISK_WAIT s (${_fv_free# }), the scenario wants $SCN_DISKS"
            [ -n "$_fv_skipped" ] && VIRTIO_ERR="$VIRTIO_ERR; in use:$_fv_skipped"
            return
        fi
        VIRTIO_DEVS=${_fv_free# }
    fi
    for _fv_d in $VIRTIO_DEVS; do
        while [ ! -b "/dev/$_fv_d" ] && [ "$(uptime_cs)" -lt "$_fv_end" ]; do sleep 1; done
        if [ ! -b "/dev/$_fv_d" ]; then VIRTIO_ERR="/dev/$_fv_d does not exist"; return; fi
    done
}

# --- module targets (scsi_debug, null_blk) ------------------------------------
MOD_LOADED=""
param_value() {     # param_value NAME DEFAULT PARAMS...
    _pv_pn=$1; _pv_pd=$2; shift 2
    for _pv_pp; do case $_pv_pp in "$_pv_pn"=*) _pv_pd=${_pv_pp#*=} ;; esac; done
    echo "$_pv_pd"
}

# insmod_closure MOD PARAMS: insmod MOD with PARAMS after the modules it
# needs (their order from $MODAVAIL; without that file, modprobe). INSERTED:
# the modules this call inserted (sysfs names, load order). 1 on error.
insmod_closure() {
    _ic_mod=$(echo "$1" | tr - _)
    _ic_params=$2
    INSERTED=""
    if [ -f "$MODAVAIL" ]; then
        _ic_line=$(grep "^$_ic_mod:" "$MODAVAIL" | head -n 1)
        if [ -z "$_ic_line" ]; then
            fail "$1 is not in $MODAVAIL (this image has no $1 module)"
            return 1
        fi
        _ic_order=${_ic_line#*:}
        # the order lists .ko names (scsi_debug, dm-multipath); MOD comes last
        _ic_last=""
        for _ic_m in $_ic_order; do _ic_last=$_ic_m; done
        [ "$(echo "$_ic_last" | tr - _)" = "$_ic_mod" ] || _ic_order="$_ic_order $_ic_mod"
        for _ic_m in $_ic_order; do
            _ic_sys=$(echo "$_ic_m" | tr - _)
            if [ "$_ic_sys" = "$_ic_mod" ]; then
                # shellcheck disable=SC2086
                _ic_out=$(insmod "$MODDIR/$_ic_m.ko" $_ic_params 2>&1 </dev/null) || {
                    fail "insmod $_ic_m.ko $_ic_params failed: $_ic_out $(kmsg_since_mark | tail -n 3 | tr '\n' ' ')"
                    return 1
                }
            else
                [ -d "/sys/module/$_ic_sys" ] && continue
                _ic_out=$(insmod "$MODDIR/$_ic_m.ko" 2>&1 </dev/null) || {
                    fail "insmod $_ic_m.ko (needed by $1) failed: $_ic_out"
                    return 1
                }
            fi
            INSERTED="$INSERTED $_ic_sys"
        done
    else
        # shellcheck disable=SC2086
        _ic_out=$(modprobe "$1" $_ic_params 2>&1 </dev/null) || {
            fail "modprobe $1 $_ic_params failed: $_ic_out $(kmsg_since_mark | tail -n 3 | tr '\n' ' ')"
            return 1
        }
        INSERTED=" $_ic_mod"
    fi
    return 0
}

load_module() {     # load_module MOD PARAMS -> DEVS, MOD_LOADED; fail on error
    _lm_mod=$1
    _lm_params=$2
    _lm_sysmod=$(echo "$_lm_mod" | tr - _)
    if [ -d "/sys/module/$_lm_sysmod" ]; then
        if [ -d "/sys/module/$_lm_sysmod/sections" ] || [ -e "/sys/module/$_lm_sysmod/refcnt" ]; then
            fail "$_lm_mod is already loaded; rmmod it first so that the scenario's parameters apply"
        else
            fail "$_lm_mod is built into this kernel; its parameters cannot be set by the scenario"
        fi
        return 1
    fi
    _lm_before=$(ls /sys/block)
    kmsg_mark
    insmod_closure "$_lm_mod" "$_lm_params" || return 1
    MOD_LOADED=$_lm_mod
    # The kernel loads a module even when a parameter is unknown to it (it only
    # logs "MOD: unknown parameter 'X' ignored"): a misspelt parameter, or one
    # this kernel's version of the module lacks, must not pass silently.
    _lm_unknown=$(kmsg_since_mark | sed -n "s/.*unknown parameter '\([^']*\)' ignored.*/\1/p" | tr '\n' ' ')
    if [ -n "$_lm_unknown" ]; then
        fail "$_lm_mod on $KERNEL has no parameter ${_lm_unknown% } (the kernel ignored it)"
        return 1
    fi
    # how many disks the module makes
    # shellcheck disable=SC2086
    case $_lm_mod in
    null_blk) _lm_want=$(param_value nr_devices 1 $_lm_params) ;;
    scsi_debug) _lm_want=$(( $(param_value add_host 1 $_lm_params) * $(param_value num_tgts 1 $_lm_params) * $(param_value max_luns 1 $_lm_params) )) ;;
    *) _lm_want=1 ;;
    esac
    _lm_end=$(( $(uptime_cs) + DISK_WAIT * 100 ))
    while :; do
        # shellcheck disable=SC2012  # sysfs names are plain
        DEVS=$(ls /sys/block | while read -r _lm_b; do
            case "
$_lm_before
" in *"
$_lm_b
"*) ;; *) echo "$_lm_b" ;; esac
        done | sort_devs)
        # shellcheck disable=SC2086
        _lm_n=$(echo $DEVS | wc -w)
        [ "$_lm_n" -ge "$_lm_want" ] && break
        if [ "$(uptime_cs)" -ge "$_lm_end" ]; then
            fail "$_lm_mod made $_lm_n new disk(s) in /sys/block within $DISK_WAIT s, expected $_lm_want"
            return 1
        fi
        sleep 1
    done
    # shellcheck disable=SC2086,SC2116
    DEVS=$(echo $DEVS)     # one line, single blanks
    for _lm_d in $DEVS; do
        while [ ! -b "/dev/$_lm_d" ] && [ "$(uptime_cs)" -lt "$_lm_end" ]; do sleep 1; done
        [ -b "/dev/$_lm_d" ] || { fail "/dev/$_lm_d did not appear"; return 1; }
    done
    return 0
}

# kmsg_mark / kmsg_since_mark: the kernel log from the mark on
KMSG_MARK=""
kmsg_mark() {
    KMSG_MARK="blklab-run.sh mark $$.$(uptime_cs)"
    if ! { echo "$KMSG_MARK" > /dev/kmsg; } 2>/dev/null; then
        KMSG_MARK="#$(dmesg 2>/dev/null | wc -l)"    # no /dev/kmsg: count lines
    fi
}
kmsg_since_mark() {
    case $KMSG_MARK in
    '#'*) dmesg 2>/dev/null | tail -n "+$(( ${KMSG_MARK#\#} + 1 ))" ;;
    *) dmesg 2>/dev/null | sed -n "/$KMSG_MARK/,\$p" ;;
    esac
}

unload_module() {
    [ -n "$MOD_LOADED" ] || return 0
    _um_i=0
    while ! _um_out=$(rmmod "$MOD_LOADED" 2>&1 </dev/null); do
        _um_i=$((_um_i + 1))
        if [ $_um_i -ge 10 ]; then
            fail "rmmod $MOD_LOADED failed: $_um_out"
            MOD_LOADED=""
            return 1
        fi
        sleep 1
    done
    MOD_LOADED=""
}

# --- dm stacks: `stack multipath` ----------------------------------------------
# One request-based dm-multipath map per logical unit of the targets: SCSI
# disks with the same channel:target:lun on different hosts (scsi_debug
# add_host=2: the hosts share one store, as two HBA ports see one FC LUN)
# are the paths of one map; any other device is a map of one path. fio then
# runs on the maps; `path_sched` sets the paths' scheduler. The table is
# the one multipath-tools loads: no features, no hardware handler, one
# priority group, the selector with one argument per path (repeat count 1).
STACK_MAPS=""; STACK_MODS=""; STACK_SAVED=""; PATHDEVS=""

dm_dev_of() {       # dm_dev_of MAP: its /sys/block name
    # shellcheck disable=SC2010  # sysfs names are plain
    for _dd_b in $(ls /sys/block | grep '^dm-[0-9][0-9]*$'); do
        [ "$(cat "/sys/block/$_dd_b/dm/name" 2>/dev/null)" = "$1" ] && { echo "$_dd_b"; return 0; }
    done
    return 1
}

make_stack() {      # make_stack KIND PARAMS: DEVS (the paths) -> DEVS (the maps), R_PATHS
    _ms_sel=service-time; _ms_psched=""
    for _ms_p in $2; do
        case $_ms_p in
        selector=*) _ms_sel=${_ms_p#*=} ;;
        path_sched=*) _ms_psched=${_ms_p#*=} ;;
        esac
    done
    if ! command -v dmsetup >/dev/null 2>&1; then
        fail "stack $1: this image has no dmsetup (images/build-initramfs.sh copies the host's: apt-get install dmsetup)"
        return 1
    fi
    kmsg_mark
    for _ms_m in dm_multipath "dm_$(echo "$_ms_sel" | tr - _)"; do
        [ -d "/sys/module/$_ms_m" ] && continue
        insmod_closure "$_ms_m" "" || return 1
        STACK_MODS="$STACK_MODS$INSERTED"
    done
    # the paths of each map, one map a line, in the order of the targets
    # shellcheck disable=SC2016  # an awk program
    _ms_groups=$(for _ms_d in $DEVS; do
        _ms_k=$(readlink "/sys/block/$_ms_d/device" 2>/dev/null)
        _ms_k=${_ms_k##*/}
        case $_ms_k in
        [0-9]*:[0-9]*:[0-9]*:[0-9]*) echo "lun:${_ms_k#*:} $_ms_d" ;;
        *) echo "dev:$_ms_d $_ms_d" ;;
        esac
    done | $AWK '!($1 in g) { o[++n] = $1 } { g[$1] = g[$1] " " $2 } END { for (i = 1; i <= n; i++) print substr(g[o[i]], 2) }')
    _ms_n=$(echo "$_ms_groups" | grep -c .)
    _ms_maps=""; R_PATHS="{"; _ms_sep=""
    _ms_i=1
    while [ "$_ms_i" -le "$_ms_n" ]; do
        _ms_paths=$(echo "$_ms_groups" | sed -n "${_ms_i}p")
        _ms_name=blklab-mpath$_ms_i
        _ms_size=""; _ms_np=0; _ms_args=""; _ms_pj=""
        for _ms_d in $_ms_paths; do
            _ms_s=$(cat "/sys/block/$_ms_d/size")
            if [ -n "$_ms_size" ] && [ "$_ms_s" != "$_ms_size" ]; then
                fail "stack multipath: paths $_ms_paths of $_ms_name differ in size ($_ms_size and $_ms_s sectors)"
                return 1
            fi
            _ms_size=$_ms_s
            _ms_np=$((_ms_np + 1))
            _ms_args="$_ms_args $(cat "/sys/block/$_ms_d/dev") 1"
            _ms_pj="$_ms_pj${_ms_pj:+, }\"$_ms_d\""
        done
        _ms_table="0 $_ms_size multipath 0 0 1 1 $_ms_sel 0 $_ms_np 1$_ms_args"
        _ms_out=$(DM_DISABLE_UDEV=1 dmsetup create "$_ms_name" --noudevsync --table "$_ms_table" 2>&1 </dev/null) || {
            fail "dmsetup create $_ms_name --table '$_ms_table' failed: $(echo "$_ms_out" | tr '\n' ' ')$(kmsg_since_mark | tail -n 2 | tr '\n' ' ')"
            dm_dev_of "$_ms_name" >/dev/null && STACK_MAPS="$STACK_MAPS $_ms_name"
            return 1
        }
        STACK_MAPS="$STACK_MAPS $_ms_name"
        _ms_dev=$(dm_dev_of "$_ms_name") || { fail "dmsetup made $_ms_name but no /sys/block/dm-N names it"; return 1; }
        _ms_end=$(( $(uptime_cs) + DISK_WAIT * 100 ))
        while [ ! -b "/dev/$_ms_dev" ] && [ "$(uptime_cs)" -lt "$_ms_end" ]; do sleep 1; done
        [ -b "/dev/$_ms_dev" ] || { fail "/dev/$_ms_dev ($_ms_name) did not appear"; return 1; }
        _ms_maps="$_ms_maps $_ms_dev"
        R_PATHS="$R_PATHS$_ms_sep\"$_ms_dev\": {\"map\": \"$_ms_name\", \"selector\": \"$_ms_sel\", \"paths\": [$_ms_pj]}"
        _ms_sep=", "
        _ms_i=$((_ms_i + 1))
    done
    R_PATHS="$R_PATHS}"
    PATHDEVS=$DEVS
    if [ -n "$_ms_psched" ]; then
        for _ms_d in $PATHDEVS; do
            STACK_SAVED="$STACK_SAVED $_ms_d:$(cur_sched "$_ms_d")"
            if ! echo "$_ms_psched" > "/sys/block/$_ms_d/queue/scheduler" 2>/dev/null || [ "$(cur_sched "$_ms_d")" != "$_ms_psched" ]; then
                fail "cannot set path_sched $_ms_psched on $_ms_d (queue/scheduler: $(cat "/sys/block/$_ms_d/queue/scheduler" 2>/dev/null))"
                return 1
            fi
        done
    fi
    # shellcheck disable=SC2086,SC2116
    DEVS=$(echo $_ms_maps)
    return 0
}

remove_stack() {    # the maps, the paths' schedulers, the modules make_stack loaded
    for _rs_m in $STACK_MAPS; do
        _rs_i=0
        while ! _rs_out=$(DM_DISABLE_UDEV=1 dmsetup remove --noudevsync "$_rs_m" 2>&1 </dev/null); do
            _rs_i=$((_rs_i + 1))
            if [ $_rs_i -ge 10 ]; then
                fail "dmsetup remove $_rs_m failed: $(echo "$_rs_out" | tr '\n' ' ')"
                break
            fi
            sleep 1
        done
    done
    for _rs_e in $STACK_SAVED; do
        _rs_d=${_rs_e%%:*}; _rs_s=${_rs_e#*:}
        [ -n "$_rs_s" ] && [ -d "/sys/block/$_rs_d/queue" ] && echo "$_rs_s" > "/sys/block/$_rs_d/queue/scheduler" 2>/dev/null
    done
    _rs_rev=""
    for _rs_m in $STACK_MODS; do _rs_rev="$_rs_m $_rs_rev"; done
    for _rs_m in $_rs_rev; do
        _rs_out=$(rmmod "$_rs_m" 2>&1 </dev/null) || fail "rmmod $_rs_m failed: $_rs_out"
    done
    STACK_MAPS=""; STACK_MODS=""; STACK_SAVED=""
    if [ -n "$PATHDEVS" ]; then DEVS=$PATHDEVS; PATHDEVS=""; fi
}

# --- queue settings -------------------------------------------------------------
cur_sched() { sed -n 's/.*\[\(.*\)\].*/\1/p' "/sys/block/$1/queue/scheduler" 2>/dev/null; }

# set_knob DEV FILE VALUE WHAT: write VALUE to /sys/block/DEV/FILE, read it back
set_knob() {
    if [ ! -e "/sys/block/$1/$2" ]; then
        fail "cannot set $4 $3 on $1: it has no $2"
        return 1
    fi
    echo "$3" > "/sys/block/$1/$2" 2>/dev/null
    _sk_got=$(cat "/sys/block/$1/$2" 2>/dev/null)
    if [ "$_sk_got" != "$3" ]; then
        fail "cannot set $4 $3 on $1 (reads back ${_sk_got:-nothing}; scheduler $(cur_sched "$1"))"
        return 1
    fi
    return 0
}

# The knobs a variant may set, in the order they are applied (nr_requests
# after the scheduler, which resets it): FILE under /sys/block/DEV, and the
# variable holding the variant's value.
KNOBS="queue/nr_requests:VNR device/queue_depth:VQDEPTH queue/nomerges:VNOMERGES queue/rq_affinity:VRQAFF"

apply_queue() {     # sched and the knobs on every DEV; remembers the old values
    SAVED_Q=""
    for _aq_d in $DEVS; do
        # DEV:sched:nr_requests:queue_depth:nomerges:rq_affinity
        _aq_saved="$_aq_d:$(cur_sched "$_aq_d")"
        for _aq_k in $KNOBS; do
            _aq_saved="$_aq_saved:$(cat "/sys/block/$_aq_d/${_aq_k%%:*}" 2>/dev/null)"
        done
        SAVED_Q="$SAVED_Q $_aq_saved"
        if [ -n "$VSCHED" ]; then
            _aq_q=/sys/block/$_aq_d/queue
            if ! echo "$VSCHED" > "$_aq_q/scheduler" 2>/dev/null || [ "$(cur_sched "$_aq_d")" != "$VSCHED" ]; then
                fail "cannot set scheduler $VSCHED on $_aq_d (queue/scheduler: $(cat "$_aq_q/scheduler" 2>/dev/null))"
                return 1
            fi
        fi
        for _aq_k in $KNOBS; do
            _aq_f=${_aq_k%%:*}
            eval "_aq_v=\$${_aq_k#*:}"
            [ -n "$_aq_v" ] || continue
            set_knob "$_aq_d" "$_aq_f" "$_aq_v" "${_aq_f#*/}" || return 1
        done
    done
    return 0
}

restore_queue() {
    for _rq_e in $SAVED_Q; do
        _rq_d=${_rq_e%%:*}; _rq_r=${_rq_e#*:}; _rq_s=${_rq_r%%:*}; _rq_r=${_rq_r#*:}
        [ -d "/sys/block/$_rq_d/queue" ] || continue
        if [ -n "$_rq_s" ] && [ "$(cur_sched "$_rq_d")" != "$_rq_s" ]; then
            echo "$_rq_s" > "/sys/block/$_rq_d/queue/scheduler" 2>/dev/null
        fi
        for _rq_k in $KNOBS; do
            _rq_f=/sys/block/$_rq_d/${_rq_k%%:*}
            _rq_v=${_rq_r%%:*}; _rq_r=${_rq_r#*:}
            if [ -n "$_rq_v" ] && [ -e "$_rq_f" ] && [ "$(cat "$_rq_f" 2>/dev/null)" != "$_rq_v" ]; then
                echo "$_rq_v" > "$_rq_f" 2>/dev/null
            fi
        done
    done
    SAVED_Q=""
}

jnum() { case $1 in ''|*[!0-9]*) echo null ;; *) echo "$1" ;; esac; }

queue_json() {      # what the devices really have, read back
    _qj_o="{"
    _qj_sep=""
    for _qj_d in $DEVS; do
        _qj_q=/sys/block/$_qj_d/queue
        _qj_s=$(cur_sched "$_qj_d")
        # shellcheck disable=SC2012  # sysfs names are plain
        _qj_hw=$(ls "/sys/block/$_qj_d/mq" 2>/dev/null | wc -l)
        _qj_o="$_qj_o$_qj_sep\"$_qj_d\": {\"scheduler\": $( [ -n "$_qj_s" ] && echo "\"$_qj_s\"" || echo null ), \"nr_requests\": $(jnum "$(cat "$_qj_q/nr_requests" 2>/dev/null)"), \"hw_queues\": $(jnum "$_qj_hw"), \"device_queue_depth\": $(jnum "$(cat "/sys/block/$_qj_d/device/queue_depth" 2>/dev/null)"), \"nomerges\": $(jnum "$(cat "$_qj_q/nomerges" 2>/dev/null)"), \"rq_affinity\": $(jnum "$(cat "$_qj_q/rq_affinity" 2>/dev/null)")}"
        _qj_sep=", "
    done
    echo "$_qj_o}"
}

# --- blk-mq debugfs ---------------------------------------------------------------
# Per hardware queue of every target: /sys/kernel/debug/block/DEV/hctxN/ATTR.
# Which ATTRs exist depends on the kernel (lib/blkmq.awk); a missing one is
# left out of the snapshot, never an error.
DEBUGFS=${BLKLAB_DEBUGFS:-/sys/kernel/debug}
BLKMQ_ATTRS="dispatched queued run dispatch_busy active tags sched_tags"
BLKMQ_ERR=""
BLKMQ_DONE=0
blkmq_prepare() {   # once per run: mount debugfs if it is not
    [ "$BLKMQ_DONE" = 1 ] && return
    BLKMQ_DONE=1
    [ -d "$DEBUGFS/block" ] && return
    _bp_out=$(mount -t debugfs none "$DEBUGFS" 2>&1 </dev/null)
    [ -d "$DEBUGFS/block" ] && return
    BLKMQ_ERR="no $DEBUGFS/block: the kernel has no CONFIG_BLK_DEBUG_FS, or mount -t debugfs none $DEBUGFS failed${_bp_out:+ ($_bp_out)}"
    say "$BLKMQ_ERR"
}

blkmq_files() {     # the readable attribute files of every target's hardware queues
    [ -z "$BLKMQ_ERR" ] || return 0
    for _bf_d in $DEVS; do
        # shellcheck disable=SC2010  # debugfs names are plain
        for _bf_h in $(ls "$DEBUGFS/block/$_bf_d" 2>/dev/null | grep '^hctx[0-9][0-9]*$'); do
            for _bf_a in $BLKMQ_ATTRS; do
                [ -r "$DEBUGFS/block/$_bf_d/$_bf_h/$_bf_a" ] && echo "$DEBUGFS/block/$_bf_d/$_bf_h/$_bf_a"
            done
        done
    done
}

# --- snapshots ------------------------------------------------------------------
snapshot() {        # snapshot FILE: the files the result document is computed from
    {
        echo "@uptime"; cat /proc/uptime
        echo "@stat"; cat /proc/stat
        echo "@interrupts"; cat /proc/interrupts
        echo "@softirqs"; cat /proc/softirqs
        for _ss_d in $DEVS; do echo "@block $_ss_d"; cat "/sys/block/$_ss_d/stat"; done
        # one awk for all debugfs files: "@blkmq DEV HCTX ATTR" and the content
        # (an empty file, e.g. sched_tags without a scheduler, has no section)
        _ss_f=$(blkmq_files)
        # shellcheck disable=SC2016,SC2086  # an awk program; file names split on purpose
        [ -n "$_ss_f" ] && $AWK 'FNR == 1 { n = split(FILENAME, p, "/"); print "@blkmq " p[n - 2] " " p[n - 1] " " p[n] } { print }' $_ss_f
    } > "$1" 2>/dev/null
}

json_ok() { [ -s "$1" ] && $AWK -f "$LIB/jsoncheck.awk" "$1" >/dev/null 2>&1; }

# --- one variant ----------------------------------------------------------------
# shellcheck disable=SC2153  # the V* variables are set by the evals below
run_variant() {     # run_variant INDEX
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
    R_QUEUE=""; R_BEFORE=""; R_AFTER=""; R_MPSTAT=""; R_FIO=""; R_FIO_RC=""; R_FIO_LOG=""; R_FIOCMD=""

    case $VKIND in
    virtio)
        find_virtio
        if [ -n "$VIRTIO_ERR" ]; then fail "$VIRTIO_ERR"; else DEVS=$VIRTIO_DEVS; fi ;;
    scsi_debug|null_blk)
        load_module "$VKIND" "$VPARAMS" ;;
    *)  fail "unknown target $VKIND" ;;
    esac

    if [ -z "$ERR" ] && [ -z "$DEVS" ]; then fail "no target devices"; fi
    if [ -z "$ERR" ] && [ -n "$VSTACK" ] && make_stack "$VSTACK" "$VSTACKP"; then
        _pq_devs=$DEVS; DEVS=$PATHDEVS; R_PATH_QUEUE=$(queue_json); DEVS=$_pq_devs
    fi
    if [ -z "$ERR" ] && apply_queue; then
        R_QUEUE=$(queue_json)
        # The scenario's options and run.sh's go before the first --name:
        # fio applies them to every job section. A fixed IO count
        # (--number_ios) ends the job; --time_based would ignore it, so then
        # the runtime is only an upper bound.
        set --
        _tb=--time_based
        for _a in $VFIO; do
            set -- "$@" "$_a"
            case "$_a" in --number_ios=*) _tb="" ;; esac
        done
        set -- "$@" --runtime="$VRUNTIME" $_tb --ramp_time="$VRAMP" --group_reporting \
            --output-format=json --output="$W/fio.out"
        if [ "$VLAYOUT" = per-disk ]; then
            # one job section per device: numjobs jobs on each
            for _d in $DEVS; do set -- "$@" --name="$VNAME.$_d" --filename="/dev/$_d"; done
        else
            files=""
            for _d in $DEVS; do files="$files:/dev/$_d"; done
            set -- "$@" --name="$VNAME" --filename="${files#:}"
        fi
        fiocmd="fio $*"

        blkmq_prepare
        # nothing touches the target disks from here to the begin SYNC reply
        snapshot "$W/before"
        R_BEFORE=$W/before
        if sync_point begin; then
            MPID=""
            if command -v mpstat >/dev/null 2>&1; then
                LC_ALL=C mpstat -P ALL -o JSON $((VRUNTIME + VRAMP)) 1 </dev/null >"$W/mpstat.json" 2>/dev/null &
                MPID=$!
            fi
            fio "$@" </dev/null >"$W/fio.log" 2>&1
            R_FIO_RC=$?
            R_FIOCMD=$fiocmd
            if [ -n "$MPID" ]; then
                if kill -0 "$MPID" 2>/dev/null; then
                    kill "$MPID" 2>/dev/null
                    wait "$MPID" 2>/dev/null
                    : > "$W/mpstat.json"    # cut short: no average
                else
                    wait "$MPID" 2>/dev/null
                fi
            fi
            sync_point end
            # nothing touches the target disks from the end SYNC reply to here
            snapshot "$W/after"
            R_AFTER=$W/after

            # fio may put notes before its JSON in the --output file
            $AWK -v pre="$W/fio.pre" '/^\{/ { j = 1 } j { print; next } { print > pre }' "$W/fio.out" > "$W/fio.json" 2>/dev/null
            [ -s "$W/fio.pre" ] && cat "$W/fio.pre" >> "$W/fio.log"
            R_FIO_LOG=$W/fio.log
            if json_ok "$W/fio.json"; then R_FIO=$W/fio.json; fi
            if [ "$R_FIO_RC" -ne 0 ]; then
                fail "fio exited with status $R_FIO_RC: $(grep -v '^[[:space:]]*$' "$W/fio.log" | head -n 3 | tr '\n' ' ')"
            elif [ -z "$R_FIO" ]; then
                fail "fio wrote no valid JSON ($($AWK -f "$LIB/jsoncheck.awk" "$W/fio.json" 2>&1 | head -n 1))"
            fi
            if json_ok "$W/mpstat.json"; then R_MPSTAT=$W/mpstat.json; fi
        fi
    fi

    restore_queue
    _devs_used=$DEVS
    remove_stack
    unload_module

    if [ -z "$ERR" ]; then R_OK=true; else R_OK=false; fi
    export R_SCENARIO="$SCN_NAME" R_VARIANT="$VNAME" R_OK R_ERROR="$ERR" R_KERNEL="$KERNEL" \
        R_NCPU="$NCPU" R_KIND="$VKIND" R_PARAMS="$VPARAMS" R_SCHED="$VSCHED" R_NR="$VNR" \
        R_QDEPTH="$VQDEPTH" R_NOMERGES="$VNOMERGES" R_RQAFF="$VRQAFF" R_LAYOUT="$VLAYOUT" \
        R_STACK="$VSTACK" R_STACKP="$VSTACKP" R_PATHS R_PATH_QUEUE \
        R_RUNTIME="$VRUNTIME" R_RAMP="$VRAMP" R_FIOARGS="$VFIO" R_FIOCMD R_DEVICES="$_devs_used" \
        R_QUEUE R_BEFORE R_AFTER R_MPSTAT R_FIO R_FIO_RC R_FIO_LOG R_BLKMQ_ERROR="$BLKMQ_ERR"
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
