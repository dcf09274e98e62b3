#!/bin/sh
# lab.sh [-o OUTDIR]: run run.sh for every scenario of $BLKLAB_SCENARIOS.
#
# BLKLAB_SCENARIOS is a comma list of scenario names (scenarios/NAME.scn) or
# .scn paths, run in order; /init sets it from blklab.scenarios=A,B on the
# kernel command line. Unknown scenarios are reported up front
# (BLKLAB-ERROR lab: ...) and skipped; the others still run. Every other
# BLKLAB_* variable (RUNTIME, RAMP, VARIANTS, SYNC, ...) passes through to
# run.sh. OUTDIR defaults to $BLKLAB_OUTDIR (none: console only).
#
# Exit status: the worst of the run.sh statuses (0 ok, 1 a variant failed,
# 2 scenario or usage error); 2 when a scenario is unknown or none is given.

HERE=$(cd "$(dirname "$0")" && pwd)
OUTDIR=${BLKLAB_OUTDIR:-}
while [ $# -gt 0 ]; do
    case $1 in
    -o) [ $# -ge 2 ] || { echo "usage: lab.sh [-o OUTDIR]" >&2; exit 2; }; OUTDIR=$2; shift 2 ;;
    *) echo "usage: lab.sh [-o OUTDIR]" >&2; exit 2 ;;
    esac
done

if [ -z "$BLKLAB_SCENARIOS" ]; then
    echo "BLKLAB-ERROR lab: no scenarios (boot with blklab.scenarios=A,B or set BLKLAB_SCENARIOS)"
    exit 2
fi

set -f
scn_path() {
    case $1 in
    */*|*.scn) echo "$1" ;;
    *) echo "$HERE/scenarios/$1.scn" ;;
    esac
}

worst=0
known=""
oldifs=$IFS
IFS=,
for s in $BLKLAB_SCENARIOS; do
    IFS=$oldifs
    [ -n "$s" ] || continue
    if [ -f "$(scn_path "$s")" ]; then
        known="$known $s"
    else
        # shellcheck disable=SC2012  # scenario names are plain
        have=$(ls "$HERE/scenarios" 2>/dev/null | sed -n 's/\.scn$//p' | tr '\n' ' ')
        echo "BLKLAB-ERROR lab: unknown scenario '$s' (have: ${have% })"
        worst=2
    fi
done
IFS=$oldifs

for s in $known; do
    if [ -n "$OUTDIR" ]; then
        sh "$HERE/run.sh" -o "$OUTDIR" "$s"
    else
        sh "$HERE/run.sh" "$s"
    fi
    rc=$?
    [ "$rc" -gt "$worst" ] && worst=$rc
done
exit $worst
