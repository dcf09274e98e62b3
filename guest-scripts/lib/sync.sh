# shellcheck shell=sh
# guest-scripts/lib/sync.sh: the SYNC handshake with the host
# (docs/lab-protocol.md section 3, "Console output"): a line "BLKLAB-SYNC N
# WHAT SCENARIO VARIANT", then wait for the host's reply "N" on stdin.
# POSIX sh; sourced by run.sh, never run.
#
# Provides: console_quiet (with BLKLAB_SYNC=1 and a tty on stdin, turn its
# echo off, so that the host's replies are not echoed onto the console
# output); console_restore (undo it; safe to call at any time, from a
# trap); sync_point WHAT [COMMAND ARG...] (run COMMAND, print the SYNC
# line and wait for its reply: 0 replied, 1 no reply within SYNC_TIMEOUT s
# or end of input, recorded with fail; without BLKLAB_SYNC=1 it only runs
# COMMAND and returns 0). N counts up per boot across every run.sh of the
# boot ($BLKLAB_SYNC_SEQ_FILE, else /run/blklab-sync-seq or
# /tmp/blklab-sync-seq).
#
# The window's edges: the host samples its counters (the plugin's dump
# among them) when it reads the SYNC line, while the guest waits for the
# reply. COMMAND (the guest's snapshot) runs right before the line, and
# from the start of COMMAND to the reply sync_point forks nothing (no
# subshell, no command substitution, no external program; with `read -t`),
# so that the guest adds nothing between its own reads and the host's
# (docs/lab-protocol.md section 3).
#
# Expects of its caller: BLKLAB_SYNC, SYNC_TIMEOUT (seconds, a checked
# number), SCN_NAME and VNAME; fail and say, clock_cs (common.sh).
#
# Must not: print anything or touch the tty when sourced (it defines
# functions, and probes in a subshell whether this shell's read has -t);
# read stdin anywhere but in read_line (stdin is the host's console).
#
# `read -t` is used only where the shell has it (busybox, bash), else
# timeout(1) (which forks while waiting).

STTY_SAVED=""
console_quiet() {
    if [ "$BLKLAB_SYNC" = 1 ] && [ -t 0 ] && command -v stty >/dev/null 2>&1; then
        # The host's replies must not be echoed back onto the console output.
        STTY_SAVED=$(stty -g 2>/dev/null) && stty -echo 2>/dev/null || STTY_SAVED=""
    fi
}
console_restore() {
    if [ -n "$STTY_SAVED" ]; then
        stty "$STTY_SAVED" 2>/dev/null
        STTY_SAVED=""
    fi
}

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
    clock_cs
    _rl_t0=$NOW_CS
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
    clock_cs
    [ $(( NOW_CS - _rl_t0 )) -ge $(( $1 * 100 - 50 )) ] && return 2
    return 1
}

# strip_blanks: LINE without blanks and CRs, in GOT (without forking)
strip_blanks() {
    GOT=$LINE
    while :; do
        case $GOT in
        *[[:space:]]*) GOT=${GOT%%[[:space:]]*}${GOT#*[[:space:]]} ;;
        *) return 0 ;;
        esac
    done
}

# sync_point WHAT [COMMAND ARG...]: run COMMAND, print the SYNC line and
# wait for the host's reply
sync_point() {
    _sp_what=$1
    shift
    if [ "$BLKLAB_SYNC" != 1 ]; then
        [ $# -eq 0 ] || "$@"
        return 0
    fi
    _sp_n=$(next_seq)
    clock_cs
    _sp_deadline=$(( NOW_CS + SYNC_TIMEOUT * 100 ))
    # nothing forks from here to the reply
    [ $# -eq 0 ] || "$@"
    echo "BLKLAB-SYNC $_sp_n $_sp_what $SCN_NAME $VNAME"
    while :; do
        clock_cs
        _sp_left=$(( (_sp_deadline - NOW_CS + 99) / 100 ))
        if [ "$_sp_left" -le 0 ]; then
            fail "no reply to BLKLAB-SYNC $_sp_n ($_sp_what) within $SYNC_TIMEOUT s"
            return 1
        fi
        read_line "$_sp_left"
        case $? in
        0)  strip_blanks
            [ "$GOT" = "$_sp_n" ] && return 0
            say "ignoring console input '$GOT' while waiting for SYNC reply $_sp_n" ;;
        1)  fail "end of input while waiting for the reply to BLKLAB-SYNC $_sp_n ($_sp_what)"
            return 1 ;;
        *)  fail "no reply to BLKLAB-SYNC $_sp_n ($_sp_what) within $SYNC_TIMEOUT s"
            return 1 ;;
        esac
    done
}
