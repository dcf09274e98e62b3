# shellcheck shell=sh
# shellcheck disable=SC2034  # the R_* variables: run.sh exports them to lib/result.awk
# guest-scripts/lib/measure.sh: a variant's measured window: the
# before-snapshot, the begin SYNC, mpstat in the background, fio, the end
# SYNC, the after-snapshot; then fio's and mpstat's output checked.
# POSIX sh; sourced by run.sh, never run.
#
# Provides: measure (the window on DEVS with the variant's fio arguments;
# sets R_BEFORE and R_AFTER (the snapshot files), R_FIO_RC, R_FIOCMD,
# R_FIO_LOG, R_FIO and R_MPSTAT (fio's and mpstat's JSON, only when
# valid); fio's failure or invalid JSON recorded with fail; when the begin
# SYNC gets no reply, only R_BEFORE is set and nothing runs); snapshot FILE
# (/proc/uptime, /proc/stat, /proc/interrupts, /proc/softirqs, every DEVS
# device's /sys/block/X/stat and blk-mq debugfs files, as the "@SECTION"
# file lib/result.awk reads); run_fio (fio's command line built and run:
# the scenario's arguments and run.sh's, then one job section, or one per
# device with layout per-disk); mpstat_start and mpstat_stop (mpstat -P
# ALL -o JSON over runtime+ramp in the background, when there is mpstat;
# cut short means no average, an empty file); fio_collect (fio's JSON
# split from the notes it may print before it, which go to its log).
#
# Expects of its caller: W (the variant's work directory), DEVS (/sys/block
# names), VNAME, VFIO (fio's arguments, the words of one string), VRUNTIME,
# VRAMP, VLAYOUT; the R_* above empty; AWK and LIB; fail and json_ok
# (common.sh), sync_point (sync.sh), blkmq_prepare and blkmq_files
# (blkmq.sh). Runs with pathname expansion off (set -f): VFIO comes from
# the scenario.
#
# Must not: issue IO on the target disks between the before-snapshot and
# the begin SYNC reply, or between the end SYNC reply and the
# after-snapshot (docs/lab-protocol.md section 3); read stdin other than
# through sync_point (fio and mpstat get /dev/null); print anything when
# sourced.

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

run_fio() {         # fio on DEVS: R_FIO_RC, R_FIOCMD; its output in W
    # The scenario's options and run.sh's go before the first --name:
    # fio applies them to every job section. A fixed IO count
    # (--number_ios) ends the job; --time_based would ignore it, so then
    # the runtime is only an upper bound.
    set --
    _rf_tb=--time_based
    for _rf_a in $VFIO; do
        set -- "$@" "$_rf_a"
        case "$_rf_a" in --number_ios=*) _rf_tb="" ;; esac
    done
    set -- "$@" --runtime="$VRUNTIME" $_rf_tb --ramp_time="$VRAMP" --group_reporting \
        --output-format=json --output="$W/fio.out"
    if [ "$VLAYOUT" = per-disk ]; then
        # one job section per device: numjobs jobs on each
        for _rf_d in $DEVS; do set -- "$@" --name="$VNAME.$_rf_d" --filename="/dev/$_rf_d"; done
    else
        _rf_files=""
        for _rf_d in $DEVS; do _rf_files="$_rf_files:/dev/$_rf_d"; done
        set -- "$@" --name="$VNAME" --filename="${_rf_files#:}"
    fi
    fio "$@" </dev/null >"$W/fio.log" 2>&1
    R_FIO_RC=$?
    R_FIOCMD="fio $*"
}

mpstat_start() {    # MPID: mpstat over runtime+ramp in the background, if there is mpstat
    MPID=""
    if command -v mpstat >/dev/null 2>&1; then
        LC_ALL=C mpstat -P ALL -o JSON $((VRUNTIME + VRAMP)) 1 </dev/null >"$W/mpstat.json" 2>/dev/null &
        MPID=$!
    fi
}

mpstat_stop() {
    [ -n "$MPID" ] || return 0
    if kill -0 "$MPID" 2>/dev/null; then
        kill "$MPID" 2>/dev/null
        wait "$MPID" 2>/dev/null
        : > "$W/mpstat.json"    # cut short: no average
    else
        wait "$MPID" 2>/dev/null
    fi
}

fio_collect() {     # R_FIO_LOG, R_FIO; fio's failure recorded
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
}

measure() {         # the window on DEVS: snapshots, SYNC, mpstat, fio
    blkmq_prepare
    # nothing touches the target disks from here to the begin SYNC reply
    snapshot "$W/before"
    R_BEFORE=$W/before
    sync_point begin || return 0
    mpstat_start
    run_fio
    mpstat_stop
    sync_point end
    # nothing touches the target disks from the end SYNC reply to here
    snapshot "$W/after"
    R_AFTER=$W/after
    fio_collect
    if json_ok "$W/mpstat.json"; then R_MPSTAT=$W/mpstat.json; fi
}
