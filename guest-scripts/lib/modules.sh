# shellcheck shell=sh
# guest-scripts/lib/modules.sh: module targets (`target scsi_debug|null_blk
# PARAMS`) and the kernel modules a variant inserts: loaded with insmod in
# the order of the image's modules-available file (else modprobe), their
# disks waited for, and unloaded after the variant. POSIX sh; sourced by
# run.sh, never run.
#
# Provides: load_module MOD PARAMS (load MOD with PARAMS, the words of one
# string; sets DEVS to the new /sys/block entries, separated by single
# blanks, and MOD_LOADED; 1 on error, recorded with fail: MOD already
# loaded or built in, a parameter the kernel ignored as unknown, fewer
# disks than MOD's parameters make within DISK_WAIT s); unload_module
# (rmmod what load_module loaded, retrying for 10 s; nothing when
# nothing); insmod_closure MOD PARAMS (insmod MOD after the modules it
# needs that are not loaded yet; INSERTED: the modules this call inserted,
# sysfs names in load order; for stack.sh's dm modules); kmsg_mark and
# kmsg_since_mark (the kernel log from the mark on); param_value NAME
# DEFAULT PARAMS... (the last NAME=VALUE of PARAMS, else DEFAULT).
#
# Reads BLKLAB_MODULE_DIR (the .ko directory, /lib/modules/blklab) and
# BLKLAB_MODULES_AVAILABLE (the load order file, /blklab/modules-available)
# when sourced, as MODDIR and MODAVAIL.
#
# Expects of its caller: KERNEL (uname -r), DISK_WAIT (seconds, a checked
# number), AWK; fail, uptime_cs and sort_devs (common.sh). Runs with
# pathname expansion off (set -f): PARAMS come from the scenario.
#
# Must not: use a module that was loaded before it (its parameters would
# not apply), or unload one it did not load; print anything when sourced.

MODDIR=${BLKLAB_MODULE_DIR:-/lib/modules/blklab}
MODAVAIL=${BLKLAB_MODULES_AVAILABLE:-/blklab/modules-available}
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
