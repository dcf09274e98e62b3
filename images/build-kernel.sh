#!/bin/sh
# build-kernel.sh --series 6.12 [--patch NAME] --out DIR [--cache DIR]
#
# Build a blklab guest kernel from Debian's `linux-source-SERIES` package:
# `make ARCH=x86_64 tinyconfig`, merge images/kernel/guest.config, `make
# olddefconfig`, check that every option of the fragment got the requested
# value, build bzImage + modules, and lay out in DIR (like
# fetch-debian-kernel.sh):
#
#   DIR/vmlinuz  DIR/System.map  DIR/config
#   DIR/lib/modules/KVER/...     (make modules_install, stripped)
#   DIR/manifest.json            (series, kernel_version, source package +
#                                 version, config/patch/vmlinuz sha256, ...)
#
# --patch NAME applies images/patches/NAME.patch (patch -p1) for this build
# only: the source tree in the cache stays clean between builds.
#
# --cache DIR (default ${BLKLAB_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images}/kernel-src)
# keeps the unpacked, configured and built tree (DIR/linux-source-SERIES,
# about 2 GB), so building the patched variant after the plain one (or the
# other way round) only recompiles the patched files and relinks. The tree's
# state (source version, configuration, which patch is applied) is recorded in
# DIR/linux-source-SERIES/.blklab/state; a build interrupted while the patch
# was applied is undone by the next run. A lock (flock on
# DIR/linux-source-SERIES.lock) serialises builds using the tree.
#
# Cached: when DIR/manifest.json records the same key (this script and
# images/lib.sh, the configuration fragments, the series, the patch; not
# the version of linux-source-SERIES, which the manifest pins) and the
# sha256 of DIR/vmlinuz matches, nothing is done ("cached"): no apt, no
# compiler.
#
# Nothing is installed: the package is fetched with `apt-get download` and
# unpacked with `dpkg -x` into the cache. Progress goes to stderr.
set -eu

LOG_NAME=build-kernel
USAGE="$0 --series SERIES [--patch NAME] --out DIR [--cache DIR]
  SERIES: a Debian linux-source-SERIES package (Debian 12: 6.1, 6.12;
          5.10 from bullseye-security, which .ci/install-deps adds, pinned)
  NAME:   images/patches/NAME.patch"
ARG_MISSING=error
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"

SERIES=""; PATCH_NAME=""; OUT=""; CACHE=""
while [ $# -gt 0 ]; do
    case "$1" in
    --series|--series=*) opt_value "$@"; SERIES=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --patch|--patch=*) opt_value "$@"; PATCH_NAME=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --out|--out=*) opt_value "$@"; OUT=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --cache|--cache=*) opt_value "$@"; CACHE=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    -h|--help) usage ;;
    *) unknown_arg "$1" ;;
    esac
done
[ -n "$SERIES" ] || { log "ERROR: --series is required"; usage; }
[ -n "$OUT" ] || { log "ERROR: --out is required"; usage; }
expr "x$SERIES" : 'x[0-9][0-9]*\.[0-9][0-9]*$' >/dev/null \
    || die "--series '$SERIES' is not a kernel series like 6.12"

# The configuration (fragments, make steps, checks) is kernel-config.sh's,
# shared with build-tree.sh: FRAGMENT, SERIES_FRAGMENT.
# shellcheck source=images/kernel-config.sh
. "$HERE/kernel-config.sh"
kconfig_fragments "$SERIES"
[ -n "$CACHE" ] || CACHE=$(image_cache)/kernel-src

PATCH_FILE=""; PATCH_SHA=""
if [ -n "$PATCH_NAME" ]; then
    case "$PATCH_NAME" in
    *[!A-Za-z0-9_.-]*|.*) die "--patch '$PATCH_NAME': expected a name from images/patches/ (letters, digits, _ . -)" ;;
    esac
    PATCH_FILE="$HERE/patches/$PATCH_NAME.patch"
    if [ ! -f "$PATCH_FILE" ]; then
        avail=$(patch_names)
        die "no patch $PATCH_FILE (available: ${avail:-none})"
    fi
    PATCH_SHA=$(sha256 "$PATCH_FILE")
fi

# --- the key and the output cache -------------------------------------------------
# The key (images/lib.sh, key_build_kernel) is this script and lib.sh, the
# fragments, the series and the patch: known before building, without apt
# lists. The Debian upload that was built is pinned in the manifest
# (source_version), not in the key, so a new upload does not invalidate a
# cache; rm -rf DIR to build the new one.
HASH=$(key_build_kernel "$SERIES" "$PATCH_NAME")
output_cached() {
    kernel_cached "$OUT" "$HASH" || return 1
    kv=$(json_field "$OUT/manifest.json" kernel_version)
    [ -n "$kv" ] && [ -d "$OUT/lib/modules/$kv" ]
}
if output_cached; then
    log "cached: $OUT ($(json_field "$OUT/manifest.json" kernel_version)${PATCH_NAME:+ +$PATCH_NAME}, $(json_field "$OUT/manifest.json" source_package) $(json_field "$OUT/manifest.json" source_version))"
    exit 0
fi
refuse_foreign "$OUT" vmlinuz "choose another --out"

# --- tools -------------------------------------------------------------------------
DEPS_HINT="apt-get install build-essential flex bison bc libelf-dev libssl-dev kmod xz-utils cpio dpkg-dev"
missing=""
for tool in apt-get apt-cache dpkg dpkg-deb make gcc ld flex bison bc perl gzip xz tar \
            patch flock setsid sha256sum depmod strip awk; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -z "$missing" ] || die "missing tools:$missing (run: $DEPS_HINT)"
# objtool (x86_64) needs libelf's headers.
if ! echo '#include <gelf.h>' | gcc -E -x c - >/dev/null 2>&1; then
    die "libelf headers (gelf.h) missing (run: apt-get install libelf-dev)"
fi

# --- the source package --------------------------------------------------------------
SRCPKG="linux-source-$SERIES"
if [ -z "$(source_series)" ]; then
    log "apt lists missing; running apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed (check the network and /etc/apt/sources.list.d)"
fi
SRCVER=$(candidate "$SRCPKG")
if ! have_version "$SRCVER"; then
    avail=$(source_series)
    die "no package $SRCPKG in the apt lists (series available here: ${avail:-none}); $(source_hint "$SERIES")"
fi


# --- lock the source tree --------------------------------------------------------------
mkdir -p "$CACHE" || die "cannot create the cache dir $CACHE"
CACHE=$(cd "$CACHE" && pwd)
TREE="$CACHE/$SRCPKG"
STATE="$TREE/.blklab/state"
exec 9>"$CACHE/$SRCPKG.lock"
if ! flock -n 9; then
    log "waiting for the lock on $TREE (another build is using it)"
    flock 9
fi
# Someone else may have built it while we waited.
if output_cached; then
    log "cached: $OUT ($(json_field "$OUT/manifest.json" kernel_version))"
    exit 0
fi
T0=$(date +%s)

state_get() { sed -n "s/^$1=//p" "$STATE" 2>/dev/null | head -n1; }
state_set() {  # state_set KEY VALUE: rewrite the state file atomically
    { grep -v "^$1=" "$STATE" 2>/dev/null || true; echo "$1=$2"; } > "$STATE.tmp"
    mv "$STATE.tmp" "$STATE"
}
patch_q() {  # patch_q ARGS...: patch in the tree, never interactive
    # --force, not --batch: --batch takes a -R of a patch that is not applied
    # as "reversed patch detected" and applies it forwards instead.
    patch -d "$TREE" -p1 --force --no-backup-if-mismatch --reject-file=- "$@" </dev/null
}

# Work files (the .deb, the unpacked package) stay inside the cache dir:
# the tree is large and /tmp may be small.
WORK=""
MAKE_PID=""
PATCH_APPLIED=0
# drop_objects PATCHFILE: remove the object (and kbuild .cmd) file of every .c
# the patch touches, so that make rebuilds them whatever the time stamps say.
drop_objects() {
    awk '/^\+\+\+ / { p = $2; sub(/^[^\/]*\//, "", p); if (p ~ /\.c$/) { sub(/\.c$/, "", p); print p } }' "$1" \
    | while read -r f; do
        rm -f "$TREE/$f.o" "$TREE/$(dirname "$f")/.$(basename "$f").o.cmd"
    done
}
# revert_patch: take the applied patch (.blklab/applied.patch) out again.
revert_patch() {
    saved="$TREE/.blklab/applied.patch"
    [ -f "$saved" ] || return 1
    patch_q -R --dry-run -s -i "$saved" >/dev/null 2>&1 || return 1
    patch_q -R -s -i "$saved" >&2 || return 1
    drop_objects "$saved"
    state_set patch none
}
# stop_make: end the background make and every compiler it started (its own
# process group) and wait for them, so that no object of a patched source
# can be written after the patch is reverted.
stop_make() {
    [ -n "$MAKE_PID" ] || return 0
    kill -s TERM -- "-$MAKE_PID" 2>/dev/null || true
    wait "$MAKE_PID" 2>/dev/null || true
    n=0
    while kill -0 -- "-$MAKE_PID" 2>/dev/null && [ "$n" -lt 100 ]; do
        sleep 0.1; n=$((n + 1))
    done
    kill -s KILL -- "-$MAKE_PID" 2>/dev/null || true
    MAKE_PID=""
}
cleanup() {
    stop_make
    if [ "$PATCH_APPLIED" = 1 ]; then
        if revert_patch; then
            log "reverted $PATCH_NAME.patch in $TREE"
        else
            log "WARNING: could not revert $PATCH_NAME.patch in $TREE; the next run will check it"
        fi
    fi
    [ -z "$WORK" ] || rm -rf "$WORK"
    [ -z "${STAGE:-}" ] || rm -rf "$STAGE"
}
on_exit cleanup

unpack_tree() {
    rm -rf "$TREE"
    WORK=$(mktemp -d "$CACHE/unpack.XXXXXX")
    chmod 755 "$WORK"   # apt-get download may drop privileges to _apt
    log "downloading $SRCPKG=$SRCVER"
    deb=$(apt_download "$WORK" "$SRCPKG=$SRCVER")
    if [ -z "$deb" ]; then
        # Old lists can name a version the mirror no longer has.
        update_and_retry download
        SRCVER=$(candidate "$SRCPKG")
        have_version "$SRCVER" || die "no package $SRCPKG after apt-get update"
        deb=$(apt_download "$WORK" "$SRCPKG=$SRCVER")
        [ -n "$deb" ] || die "apt-get download $SRCPKG=$SRCVER produced no .deb (check the network / apt sources)"
    fi
    log "unpacking $(basename "$deb")"
    dpkg -x "$deb" "$WORK/pkg" || die "dpkg -x $deb failed"
    tarball=$(first "$WORK"/pkg/usr/src/linux-source-*.tar.*)
    [ -n "$tarball" ] || die "$deb has no usr/src/linux-source-*.tar.*"
    mkdir "$WORK/src"
    tar -xf "$tarball" -C "$WORK/src" || die "cannot unpack $tarball (apt-get install xz-utils)"
    top=$(first "$WORK"/src/*)
    { [ -n "$top" ] && [ -f "$top/Makefile" ]; } || die "$tarball has no kernel tree"
    mv "$top" "$TREE"
    rm -rf "$WORK"; WORK=""
    mkdir -p "$TREE/.blklab"
    { echo "source_version=$SRCVER"; echo "config="; echo "patch=none"; } > "$STATE"
}

# --- make sure the tree is the right version and clean --------------------------------------
if [ ! -f "$STATE" ]; then
    [ ! -e "$TREE" ] || log "$TREE has no state file; unpacking it again"
    unpack_tree
elif [ "$(state_get source_version)" != "$SRCVER" ]; then
    log "$TREE is $SRCPKG $(state_get source_version), want $SRCVER; unpacking it again"
    unpack_tree
fi
applied=$(state_get patch)
if [ -n "$applied" ] && [ "$applied" != none ]; then
    saved="$TREE/.blklab/applied.patch"
    if revert_patch; then
        log "the tree still had patch '${applied%% *}' applied (an earlier build was interrupted); reverted it"
    elif [ -f "$saved" ] && patch_q --dry-run -s -i "$saved" >/dev/null 2>&1; then
        log "patch '${applied%% *}' was recorded but is not applied; the tree is clean"
        drop_objects "$saved"
        state_set patch none
    else
        log "the tree is in an unknown patch state ('${applied%% *}' half applied?); unpacking it again"
        unpack_tree
    fi
fi

# --- configure -------------------------------------------------------------------------
TS=$(LC_ALL=C date -u -d "@$(stat -c %Y "$TREE/Makefile")" '+%a %b %e %H:%M:%S UTC %Y')
kmake() {
    env LOCALVERSION= KBUILD_BUILD_USER=blklab KBUILD_BUILD_HOST=blklab \
        KBUILD_BUILD_TIMESTAMP="$TS" KBUILD_BUILD_VERSION="1${PATCH_NAME:++$PATCH_NAME}" \
        make -C "$TREE" --no-print-directory ARCH=x86_64 "$@"
}
LOGDIR="$TREE/.blklab"
CONFIG_KEY=$(kconfig_key)
# A failed check forgets the configuration: the next build configures again.
kconfig_failed() { state_set config ""; }

if [ "$(state_get config)" != "$CONFIG_KEY" ] || [ ! -f "$TREE/.config" ]; then
    state_set config ""
    kconfig_configure "$TREE" "$LOGDIR/config.log"
fi
kconfig_check "$TREE" "$SERIES"
state_set config "$CONFIG_KEY"

# --- patch ---------------------------------------------------------------------------------
if [ -n "$PATCH_NAME" ]; then
    out=$(patch_q --dry-run -i "$PATCH_FILE" 2>&1) || {
        echo "$out" >&2
        die "images/patches/$PATCH_NAME.patch does not apply to $SRCPKG $SRCVER (patch -p1 --dry-run failed above); refresh the patch"
    }
    cp "$PATCH_FILE" "$TREE/.blklab/applied.patch"
    state_set patch "$PATCH_NAME $PATCH_SHA"
    PATCH_APPLIED=1
    patch_q -s -i "$TREE/.blklab/applied.patch" >&2 || die "applying $PATCH_FILE failed"
    drop_objects "$TREE/.blklab/applied.patch"
    log "applied $PATCH_NAME.patch"
fi

# --- build -----------------------------------------------------------------------------------
JOBS=$(nproc 2>/dev/null || echo 2)
BUILD_LOG="$LOGDIR/build.log"
log "make -j$JOBS bzImage modules ($SRCPKG $SRCVER${PATCH_NAME:+ +$PATCH_NAME}; log: $BUILD_LOG)"
KMAKE_ENV="LOCALVERSION= KBUILD_BUILD_USER=blklab KBUILD_BUILD_HOST=blklab KBUILD_BUILD_VERSION=1${PATCH_NAME:++$PATCH_NAME}"
# In a session of its own (setsid): stop_make can end all of it.
kconfig_make "$TREE" "$BUILD_LOG" "$JOBS" bzImage modules

KVER=$(kmake -s kernelrelease 2>/dev/null | tail -n1)
[ -n "$KVER" ] || die "make kernelrelease printed nothing"
[ -f "$TREE/arch/x86/boot/bzImage" ] || die "no arch/x86/boot/bzImage after the build"
# UTS_VERSION: include/generated/utsversion.h since 6.0, compile.h before (5.10).
UTSV=$(sed -n 's/^#define UTS_VERSION "\(.*\)"$/\1/p' "$TREE/include/generated/utsversion.h" \
    "$TREE/include/generated/compile.h" 2>/dev/null | head -n1)

# --- lay out the output ---------------------------------------------------------------------
kconfig_stage "$TREE" "$OUT" "$LOGDIR" "$KVER"

# The outputs are copied: the tree goes back to clean right away.
if [ "$PATCH_APPLIED" = 1 ]; then
    revert_patch || die "cannot revert $PATCH_NAME.patch in $TREE (rm -rf $TREE to start over)"
    PATCH_APPLIED=0
    log "reverted $PATCH_NAME.patch (the tree is clean again)"
fi

VMLINUZ_SHA=$(sha256 "$STAGE/vmlinuz")
CONFIG_SHA=$(sha256 "$STAGE/config")
if [ -n "$PATCH_NAME" ]; then
    PATCH_JSON="{\"name\": \"$PATCH_NAME\", \"sha256\": \"$PATCH_SHA\"}"
else
    PATCH_JSON=null
fi
cat > "$STAGE/manifest.json" <<EOF
{
  "kind": "build",
  "series": "$SERIES",
  "kernel_version": "$KVER",
  "uts_version": "$UTSV",
  "arch": "x86_64",
  "source_package": "$SRCPKG",
  "source_version": "$SRCVER",
  "config_fragment_sha256": "$(sha256 "$FRAGMENT")",
  "series_config_fragment_sha256": $(if [ -n "$SERIES_FRAGMENT" ]; then echo "\"$(sha256 "$SERIES_FRAGMENT")\""; else echo null; fi),
  "config_sha256": "$CONFIG_SHA",
  "patch": $PATCH_JSON,
  "vmlinuz_sha256": "$VMLINUZ_SHA",
  "inputs_hash": "$HASH",
  "built_at": "$(utc_now)",
  "make_seconds": $MAKE_SECS,
  "build_seconds": $(( $(date +%s) - T0 ))
}
EOF

if [ -e "$OUT" ]; then
    rm -rf "$OUT.old"
    mv "$OUT" "$OUT.old"
fi
mv "$STAGE" "$OUT"
STAGE=""
rm -rf "$OUT.old"
log "done: $OUT (kernel $KVER${PATCH_NAME:+ +$PATCH_NAME}, $(( $(date +%s) - T0 ))s, vmlinuz $(du -h "$OUT/vmlinuz" | cut -f1))"
