# shellcheck shell=sh
# guest-scripts/lib/queue.sh: a variant's queue settings on its target
# devices: the scheduler, then the knobs (nr_requests, which the scheduler
# resets, device/queue_depth, nomerges, rq_affinity), each written and read
# back; the old values put back after the variant; and what the devices
# really have, as JSON. POSIX sh; sourced by run.sh, never run.
#
# Provides: apply_queue (VSCHED and the knobs of KNOBS on every DEVS
# device, the old values kept in SAVED_Q; 1 at the first value that does
# not read back, recorded with fail); restore_queue (SAVED_Q's values back
# where they differ, on the devices that still exist; SAVED_Q emptied);
# queue_json (per DEVS device: scheduler, nr_requests, hw_queues,
# device_queue_depth, nomerges, rq_affinity, as read now: a JSON object);
# cur_sched DEV (the active scheduler); set_knob DEV FILE VALUE WHAT;
# KNOBS (FILE:VARIABLE pairs, in the order they are applied).
#
# Expects of its caller: DEVS (/sys/block names), VSCHED, VNR, VQDEPTH,
# VNOMERGES and VRQAFF (the variant's values; empty: leave it), SAVED_Q
# empty at the start of each variant; fail and jnum (common.sh).
#
# Must not: touch a device outside DEVS; print anything when sourced.

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
