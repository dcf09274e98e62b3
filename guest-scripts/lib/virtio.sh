# shellcheck shell=sh
# guest-scripts/lib/virtio.sh: the target devices of a `target virtio`
# variant: the disks named on run.sh's command line, else every free
# /sys/block/vd*, waiting for them to appear. POSIX sh; sourced by run.sh,
# never run.
#
# Provides: find_virtio (once per run, later calls return at once: sets
# VIRTIO_DEVS, the devices as /sys/block names separated by single blanks,
# or VIRTIO_ERR, why there are none; it calls no fail, the caller does);
# is_in_use NAME (the disk or one of its partitions is mounted, swap or
# held by dm/md); list_vd (the /sys/block/vd* names, in the kernel's
# order).
#
# Expects of its caller: EXPLICIT_DEVS (the DEV arguments as /sys/block
# names; empty: pick the free ones), SCN_DISKS (how many disks the
# scenario wants), DISK_WAIT (seconds, a checked number), AWK; say,
# uptime_cs and sort_devs (common.sh).
#
# Must not: pick or accept a disk that is in use (fio writes to the
# targets); write to any device; print anything when sourced.
#
# sysfs names are plain: `ls` output is safe to split.

VIRTIO_DEVS=""
VIRTIO_DONE=0
VIRTIO_ERR=""

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

list_vd() {
    # shellcheck disable=SC2010  # sysfs names are plain
    ls /sys/block 2>/dev/null | grep '^vd[a-z]*$' | sort_devs
}

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
