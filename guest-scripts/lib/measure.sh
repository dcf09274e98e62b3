# shellcheck shell=sh
# shellcheck disable=SC2034  # the R_* variables: run.sh exports them to lib/result.awk
# guest-scripts/lib/measure.sh: a variant's measured window: the
# before-snapshot and the begin SYNC, mpstat in the background, fio, the
# after-snapshot and the end SYNC, the edge reads after each reply; then
# fio's and mpstat's output checked. POSIX sh; sourced by run.sh, never run.
#
# Provides: measure (the window on DEVS with the variant's fio arguments;
# sets R_BEFORE and R_AFTER (the snapshot files), R_BEFORE_EDGE and
# R_AFTER_EDGE (the edge reads, when the SYNC was answered), R_FIO_RC,
# R_FIOCMD, R_FIO_LOG, R_FIO and R_MPSTAT (fio's and mpstat's JSON, only
# when valid); fio's failure or invalid JSON recorded with fail; when the
# begin SYNC gets no reply, only R_BEFORE is set and nothing runs);
# snapshot FILE (every DEVS device's /sys/block/X/stat, the blk-mq
# debugfs files of SNAP_BLKMQ (listed by measure before the window),
# /proc/softirqs, /proc/uptime, /proc/stat, /proc/interrupts, as the
# "@SECTION" file lib/result.awk reads, without forking); edge_read FILE
# (/proc/uptime, /proc/stat and /proc/interrupts the same way); run_fio
# (fio's command line built and run: the scenario's arguments and
# run.sh's, then one job section, or one per device with layout
# per-disk); mpstat_start and mpstat_stop (mpstat -P ALL -o JSON over
# runtime+ramp in the background, when there is mpstat; cut short means no
# average, an empty file); fio_collect (fio's JSON split from the notes it
# may print before it, which go to its log).
#
# The window: both snapshots are taken by sync_point right before it
# prints the SYNC line, without forking, and the guest forks nothing until
# the host's reply; the host samples at the line (docs/lab-protocol.md
# section 3). So the guest's counters and the host's cover the same
# window, but for what the guest's kernel does on its own between the
# guest's reads and the host's samples; the edge reads after each reply
# bound that (at most their deltas from the snapshot).
#
# Expects of its caller: W (the variant's work directory), DEVS (/sys/block
# names), VNAME, VFIO (fio's arguments, the words of one string), VRUNTIME,
# VRAMP, VLAYOUT; the R_* above empty; AWK and LIB; fail, json_ok and
# copy_file (common.sh), sync_point (sync.sh), blkmq_prepare and
# blkmq_files (blkmq.sh). Runs with pathname expansion off (set -f): VFIO
# comes from the scenario.
#
# Must not: issue IO on the target disks between the before-snapshot and
# the begin SYNC reply, or between fio's end and the after-snapshot
# (docs/lab-protocol.md section 3); fork in snapshot and edge_read; read
# stdin other than through sync_point (fio and mpstat get /dev/null);
# print anything when sourced.

snapshot() {        # snapshot FILE: the files the result document is computed from
    {
        for _ss_d in $DEVS; do echo "@block $_ss_d"; copy_file "/sys/block/$_ss_d/stat"; done
        # "@blkmq DEV HCTX ATTR" and the content (an empty file, e.g.
        # sched_tags without a scheduler, has no section)
        for _ss_f in $SNAP_BLKMQ; do
            _ss_a=${_ss_f##*/}
            _ss_r=${_ss_f%/*}
            _ss_h=${_ss_r##*/}
            _ss_r=${_ss_r%/*}
            _ss_hdr="@blkmq ${_ss_r##*/} $_ss_h $_ss_a"
            while IFS= read -r _ss_l || [ -n "$_ss_l" ]; do
                [ -z "$_ss_hdr" ] || printf '%s\n' "$_ss_hdr"
                _ss_hdr=""
                printf '%s\n' "$_ss_l"
            done < "$_ss_f"
        done
        echo "@softirqs"; copy_file /proc/softirqs
        edge_read_sections
    } > "$1" 2>/dev/null
}

edge_read_sections() {  # the sections edge_read writes, on stdout
    echo "@uptime"; copy_file /proc/uptime
    echo "@stat"; copy_file /proc/stat
    echo "@interrupts"; copy_file /proc/interrupts
}

edge_read() {       # edge_read FILE: uptime, stat and interrupts again, after a SYNC reply
    edge_read_sections > "$1" 2>/dev/null
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
    # the hardware queues do not change during the variant: listed once,
    # before the window (listing them forks)
    SNAP_BLKMQ=$(blkmq_files)
    # nothing touches the target disks from here to the begin SYNC reply
    R_BEFORE=$W/before
    sync_point begin snapshot "$W/before" || return 0
    [ "$BLKLAB_SYNC" != 1 ] || { edge_read "$W/before.edge"; R_BEFORE_EDGE=$W/before.edge; }
    mpstat_start
    run_fio
    mpstat_stop
    # nothing touches the target disks from fio's end to the end SYNC
    R_AFTER=$W/after
    if sync_point end snapshot "$W/after" && [ "$BLKLAB_SYNC" = 1 ]; then
        edge_read "$W/after.edge"
        R_AFTER_EDGE=$W/after.edge
    fi
    fio_collect
    if json_ok "$W/mpstat.json"; then R_MPSTAT=$W/mpstat.json; fi
}
