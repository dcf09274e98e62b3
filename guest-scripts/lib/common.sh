# shellcheck shell=sh
# guest-scripts/lib/common.sh: what every part of run.sh uses: its
# diagnostics, a variant's error state, the clock, device-name order and
# small JSON helpers. POSIX sh; sourced by run.sh, never run.
#
# Provides: say MSG (a diagnostic on stderr, "run.sh: MSG", not a protocol
# line); fail MSG (the variant's error: a "BLKLAB-ERROR SCENARIO VARIANT:
# MSG" line on stdout, appended to ERR, joined by "; "); uptime_cs
# (/proc/uptime in centiseconds) and clock_cs (the same in NOW_CS, without
# forking); copy_file FILE (FILE on stdout, without forking); sort_devs (stdin's device names in the
# kernel's order: vda..vdz, vdaa..); jnum VALUE (VALUE as a JSON number,
# null when it is not a non-negative integer); json_ok FILE (FILE is
# non-empty valid JSON, by lib/jsoncheck.awk).
#
# Expects of its caller: AWK (the awk to run) and LIB (this directory);
# for fail, SCN_NAME and VNAME (the scenario and the variant being run)
# and ERR (empty at the start of each variant).
#
# Must not: print anything or touch the system when sourced (it only
# defines functions). Protocol lines (docs/lab-protocol.md) other than
# fail's BLKLAB-ERROR are run.sh's.
#
# POSIX sh has no `local`: the functions' own variables are named _xx_*.

say() { echo "run.sh: $*" >&2; }     # diagnostics (not protocol lines)

fail() {    # record (first one wins the "error" slot) and print an error
    echo "BLKLAB-ERROR $SCN_NAME $VNAME: $*"
    if [ -z "$ERR" ]; then ERR=$*; else ERR="$ERR; $*"; fi
}

clock_cs() {    # NOW_CS: /proc/uptime in centiseconds, without forking
    read -r _uc_u _uc_rest < /proc/uptime
    _uc_i=${_uc_u%.*}
    _uc_f=${_uc_u#*.}
    NOW_CS=$(( _uc_i * 100 + ${_uc_f#0} ))
}
uptime_cs() {   # /proc/uptime in centiseconds
    clock_cs
    echo "$NOW_CS"
}

copy_file() {   # FILE on stdout with the shell's read and printf only (no fork)
    while IFS= read -r _cf_l || [ -n "$_cf_l" ]; do printf '%s\n' "$_cf_l"; done < "$1"
}

# sorted like the kernel names them: vda..vdz, vdaa..
sort_devs() {
    # shellcheck disable=SC2016  # awk programs
    $AWK '{ printf "%d %s\n", length($0), $0 }' | sort -k1,1n -k2,2 | $AWK '{ print $2 }'
}

jnum() { case $1 in ''|*[!0-9]*) echo null ;; *) echo "$1" ;; esac; }

json_ok() { [ -s "$1" ] && $AWK -f "$LIB/jsoncheck.awk" "$1" >/dev/null 2>&1; }
