# shellcheck shell=sh
# guest-scripts/lib/blkmq.sh: blk-mq debugfs, per hardware queue of every
# target: /sys/kernel/debug/block/DEV/hctxN/ATTR, for the snapshots
# (lib/blkmq.awk reduces them). Which ATTRs exist depends on the kernel; a
# missing one is left out of the snapshot, never an error. POSIX sh;
# sourced by run.sh, never run.
#
# Provides: blkmq_prepare (once per run: mount debugfs if it is not; when
# there is no DEBUGFS/block afterwards, BLKMQ_ERR says why, once, with
# say: the documents carry it as blk_mq.error); blkmq_files
# (the readable ATTR files of every DEVS device's hardware queues, one a
# line; nothing after a BLKMQ_ERR); BLKMQ_ATTRS, the attributes read.
#
# Reads BLKLAB_DEBUGFS (where debugfs is, /sys/kernel/debug) when sourced,
# as DEBUGFS.
#
# Expects of its caller: DEVS (/sys/block names); say (common.sh).
#
# Must not: fail a variant (blk-mq numbers are optional); write a debugfs
# file; print anything when sourced.

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
