# shellcheck shell=sh
# shellcheck disable=SC2034  # the R_* variables: run.sh exports them to lib/result.awk
# guest-scripts/lib/stack.sh: dm stacks on a variant's targets (`stack
# multipath [selector=S] [path_sched=S]`). POSIX sh; sourced by run.sh,
# never run.
#
# One request-based dm-multipath map per logical unit of the targets: SCSI
# disks with the same channel:target:lun on different hosts (scsi_debug
# add_host=2: the hosts share one store, as two HBA ports see one FC LUN)
# are the paths of one map; any other device is a map of one path. fio then
# runs on the maps; `path_sched` sets the paths' scheduler. The table is
# the one multipath-tools loads: no features, no hardware handler, one
# priority group, the selector with one argument per path (repeat count 1).
#
# Provides: stack_up (make_stack with the variant's VSTACK and VSTACKP,
# then R_PATH_QUEUE: the paths' queue settings read back, as JSON; 1 on
# error, recorded with fail); make_stack KIND PARAMS (DEVS, the paths ->
# DEVS, the maps' dm-N names; PATHDEVS: the paths; R_PATHS: per map device
# its map name, selector and paths, as JSON); remove_stack (the maps, the
# paths' schedulers and the dm modules make_stack inserted, and DEVS the
# paths again; nothing without a stack); dm_dev_of MAP (its /sys/block
# name).
#
# Expects of its caller: DEVS (the targets, /sys/block names), VSTACK,
# VSTACKP, DISK_WAIT (seconds, a checked number), AWK; fail and uptime_cs
# (common.sh), insmod_closure and kmsg_* (modules.sh), cur_sched and
# queue_json (queue.sh); dmsetup on PATH. Runs with pathname expansion off
# (set -f): PARAMS come from the scenario.
#
# Must not: leave a map, a path's scheduler or a dm module of its own
# behind once remove_stack ran; remove a map or module it did not make;
# print anything when sourced.

STACK_MAPS=""; STACK_MODS=""; STACK_SAVED=""; PATHDEVS=""

# stack_up: the variant's stack on DEVS, and its paths' queue settings
stack_up() {
    make_stack "$VSTACK" "$VSTACKP" || return 1
    _su_devs=$DEVS; DEVS=$PATHDEVS; R_PATH_QUEUE=$(queue_json); DEVS=$_su_devs
}

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
