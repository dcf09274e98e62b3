#!/bin/sh
# build-tree.sh --tree DIR --out DIR [--jobs N]
#
# Build a guest kernel from a kernel developer's own source tree (what
# `blklab bisect` builds at each commit) with exactly the configuration of
# the `build:` kernels (kernel-config.sh, shared with build-kernel.sh):
# `make ARCH=x86_64 tinyconfig`, merge images/kernel/guest.config (and
# guest-SERIES.config when the tree's series has one), `make olddefconfig`,
# check every option of the fragments, `make bzImage modules`, and lay out
# in OUT what build-kernel.sh lays out:
#
#   OUT/vmlinuz  OUT/System.map  OUT/config
#   OUT/lib/modules/KVER/...     (make modules_install, stripped)
#   OUT/manifest.json            (kind "tree", the tree, its git commit,
#                                 kernel_version, config/vmlinuz sha256, ...)
#
# The tree is built in place, incrementally: what the objects already in
# it allow is not compiled again. Its .config becomes the guest's (the
# caller keeps the user's; `blklab bisect` saves and restores it). When the
# configuration comes out byte-identical to the .config already there, the
# old file (and its time stamp) stays, so nothing is rebuilt for it. A lock
# (flock on DIR/.blklab/build.lock) serialises builds in one tree. Nothing
# is installed; no network. Progress goes to stderr.
set -eu

LOG_NAME=build-tree
USAGE="$0 --tree DIR --out DIR [--jobs N]
  DIR:  a Linux source tree (x86_64), built in place
  OUT:  where vmlinuz, System.map, config, lib/modules and manifest.json go"
ARG_MISSING=error
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"
# shellcheck source=images/kernel-config.sh
. "$HERE/kernel-config.sh"

TREE=""; OUT=""; JOBS=""
while [ $# -gt 0 ]; do
    case "$1" in
    --tree|--tree=*) opt_value "$@"; TREE=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --out|--out=*) opt_value "$@"; OUT=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --jobs|--jobs=*) opt_value "$@"; JOBS=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    -h|--help) usage ;;
    *) unknown_arg "$1" ;;
    esac
done
[ -n "$TREE" ] || { log "ERROR: --tree is required"; usage; }
[ -n "$OUT" ] || { log "ERROR: --out is required"; usage; }
[ -n "$JOBS" ] || JOBS=$(nproc 2>/dev/null || echo 2)
case "$JOBS" in
''|*[!0-9]*|0) die "--jobs '$JOBS': expected a number of parallel jobs (1 or more)" ;;
esac
[ -d "$TREE" ] || die "--tree $TREE: no such directory"
TREE=$(cd "$TREE" && pwd)
{ [ -f "$TREE/Makefile" ] && [ -f "$TREE/Kconfig" ] && [ -d "$TREE/arch/x86" ]; } \
    || die "--tree $TREE is not a Linux source tree (no Makefile, Kconfig, arch/x86)"

need_tools "apt-get install build-essential flex bison bc libelf-dev libssl-dev kmod" \
    make gcc ld flex bison bc perl setsid flock sha256sum awk cmp
if ! echo '#include <gelf.h>' | gcc -E -x c - >/dev/null 2>&1; then
    die "libelf headers (gelf.h) missing (run: apt-get install libelf-dev)"
fi

# The series (VERSION.PATCHLEVEL of the Makefile) picks guest-SERIES.config.
mkvar() { sed -n "s/^$1 *= *\([0-9]*\) *$/\1/p" "$TREE/Makefile" | head -n1; }
SERIES="$(mkvar VERSION).$(mkvar PATCHLEVEL)"
expr "x$SERIES" : 'x[0-9][0-9]*\.[0-9][0-9]*$' >/dev/null \
    || die "$TREE/Makefile names no VERSION/PATCHLEVEL"
kconfig_fragments "$SERIES"

COMMIT=""; DIRTY=false
if git -C "$TREE" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    COMMIT=$(git -C "$TREE" rev-parse HEAD 2>/dev/null || true)
    [ -z "$(git -C "$TREE" status --porcelain --untracked-files=no 2>/dev/null)" ] || DIRTY=true
fi
# The build's time stamp: the commit's (reproducible per commit), else the
# Makefile's.
if [ -n "$COMMIT" ]; then
    STAMP=$(git -C "$TREE" log -1 --format=%ct HEAD)
else
    STAMP=$(stat -c %Y "$TREE/Makefile")
fi
TS=$(LC_ALL=C date -u -d "@$STAMP" '+%a %b %e %H:%M:%S UTC %Y')
KMAKE_ENV="LOCALVERSION= KBUILD_BUILD_USER=blklab KBUILD_BUILD_HOST=blklab KBUILD_BUILD_VERSION=1"
kmake() {
    # shellcheck disable=SC2086  # KMAKE_ENV: NAME=VALUE words
    env $KMAKE_ENV KBUILD_BUILD_TIMESTAMP="$TS" \
        make -C "$TREE" --no-print-directory ARCH=x86_64 "$@"
}

LOGDIR="$TREE/.blklab"
mkdir -p "$LOGDIR" || die "cannot create $LOGDIR"
exec 9>"$LOGDIR/build.lock"
if ! flock -n 9; then
    log "waiting for the lock on $TREE (another build is using it)"
    flock 9
fi
T0=$(date +%s)
MAKE_PID=""
STAGE=""
stop_make() {
    [ -n "$MAKE_PID" ] || return 0
    kill -s TERM -- "-$MAKE_PID" 2>/dev/null || true
    wait "$MAKE_PID" 2>/dev/null || true
    kill -s KILL -- "-$MAKE_PID" 2>/dev/null || true
    MAKE_PID=""
}
cleanup() {
    stop_make
    [ -z "$STAGE" ] || rm -rf "$STAGE"
    [ ! -f "$LOGDIR/config.before" ] || rm -f "$LOGDIR/config.before"
}
on_exit cleanup

# --- configure (every build: the commit's Kconfig may differ) ----------------------
[ ! -f "$TREE/.config" ] || cp -p "$TREE/.config" "$LOGDIR/config.before"
kconfig_configure "$TREE" "$LOGDIR/config.log"
if [ -f "$LOGDIR/config.before" ] && cmp -s "$LOGDIR/config.before" "$TREE/.config"; then
    mv "$LOGDIR/config.before" "$TREE/.config"   # the same: keep its time stamp
    log "configuration unchanged"
fi
kconfig_check "$TREE" "$SERIES"

# --- build ---------------------------------------------------------------------------
log "make -j$JOBS bzImage modules (${COMMIT:-$TREE}$( [ "$DIRTY" = false ] || echo ', with uncommitted changes'); log: $LOGDIR/build.log)"
kconfig_make "$TREE" "$LOGDIR/build.log" "$JOBS" bzImage modules
KVER=$(kmake -s kernelrelease 2>/dev/null | tail -n1)
[ -n "$KVER" ] || die "make kernelrelease printed nothing"
[ -f "$TREE/arch/x86/boot/bzImage" ] || die "no arch/x86/boot/bzImage after the build"
[ -f "$TREE/System.map" ] || die "no System.map after the build"

# --- lay out the output ----------------------------------------------------------------
kconfig_stage "$TREE" "$OUT" "$LOGDIR" "$KVER"
cat > "$STAGE/manifest.json" <<EOF
{
  "kind": "tree",
  "series": "$SERIES",
  "kernel_version": "$(jstr "$KVER")",
  "arch": "x86_64",
  "tree": "$(jstr "$TREE")",
  "git_commit": $(if [ -n "$COMMIT" ]; then echo "\"$COMMIT\""; else echo null; fi),
  "dirty": $DIRTY,
  "config_fragment_sha256": "$(sha256 "$FRAGMENT")",
  "series_config_fragment_sha256": $(if [ -n "$SERIES_FRAGMENT" ]; then echo "\"$(sha256 "$SERIES_FRAGMENT")\""; else echo null; fi),
  "config_sha256": "$(sha256 "$STAGE/config")",
  "vmlinuz_sha256": "$(sha256 "$STAGE/vmlinuz")",
  "modules_dir": "lib/modules/$(jstr "$KVER")",
  "built_at": "$(utc_now)",
  "make_seconds": $MAKE_SECS,
  "build_seconds": $(( $(date +%s) - T0 ))
}
EOF
rm -rf "$OUT"
mv "$STAGE" "$OUT"
STAGE=""
log "done: $OUT (kernel $KVER, ${COMMIT:+commit $(echo "$COMMIT" | cut -c1-12), }make ${MAKE_SECS}s, $(( $(date +%s) - T0 ))s in all)"
