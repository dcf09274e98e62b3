#!/bin/sh
# build-qemu-bundle.sh [--cache DIR] [--qemu PATH] [--key]
#
# The installed QEMU made portable, for `blklab images export --bundle`: a
# host without Debian's packages (no QEMU, no apt, no compiler, another
# distribution's glibc) runs the lab from it. Prints the bundle's
# directory on stdout (progress goes to stderr).
#
# DIR/qemu-bundle-HASH/ (HASH: the key's first 16 hex digits):
#   bin/qemu-system-x86_64      a POSIX sh wrapper, the QEMU the lab runs:
#                               it execs the bundle's ELF loader on the
#                               bundle's QEMU with --library-path lib/ and
#                               -L share/qemu (never the host's loader or
#                               libraries, never LD_LIBRARY_PATH)
#   libexec/qemu-system-x86_64  QEMU (--qemu, default qemu-system-x86_64 on
#                               PATH), the binary itself
#   lib/ld-linux-x86-64.so.2    its ELF interpreter (Debian's glibc loader:
#                               a Debian glibc is never mixed with the
#                               host's)
#   lib/NAME                    every library ldd lists for QEMU and the
#                               plugin, under the name asked for (soname)
#   share/qemu/FILE             the firmware a lab guest reads
#                               (QEMU_FIRMWARE, qemu-lib.sh)
#   plugin/libblklab-insns.so   the instruction-count plugin for this QEMU
#                               (build-qemu-plugin.sh, built first when it
#                               is not in the cache)
#   manifest.json, inputs
#
# The wrapper execs, so the QEMU process is the one its caller started
# (the same pid, and a PR_SET_PDEATHSIG set before the exec stays).
#
# Checked in the staging directory before it goes into place: the
# bundle's loader resolves every library of QEMU and the plugin inside
# lib/ (ld.so --list), and QEMU started through the wrapper prints the
# installed QEMU's --version, lists share/qemu first in -L help and loads
# the plugin.
#
# Key: the installed QEMU (package, version and --version, as the
# plugin's; a QEMU from no package: its sha256), the plugin's key, the
# sha256 of the loader, of every library and of each firmware file, this
# script, lib.sh and qemu-lib.sh. `--key` prints it as JSON (key, dir,
# qemu): local reads only, no network, no apt.
#
# Cached: DIR/qemu-bundle-HASH/manifest.json with the key and the sha256
# of the QEMU binary: nothing is done. Built in DIR/.qemu-bundle.XXXXXX
# and renamed into place, under the cache's lock (DIR/.prepare.lock, as
# prepare.sh and `blklab images import` take it).
#
# Exit status non-zero with a last line `build-qemu-bundle: ERROR: …`
# naming the fix on any failure.
set -eu

LOG_NAME=build-qemu-bundle
USAGE="$0 [--cache DIR] [--qemu PATH] [--key]
  --key: print the bundle's key and its directory's name in the cache, build nothing"
ARG_MISSING=error
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"
# shellcheck source=images/qemu-lib.sh
. "$HERE/qemu-lib.sh"

CACHE=""
QEMU=qemu-system-x86_64
KEY_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
    --cache|--cache=*) opt_value "$@"; CACHE=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --key) KEY_ONLY=1; shift ;;
    --qemu|--qemu=*) opt_value "$@"; QEMU=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    -h|--help) usage ;;
    *) unknown_arg "$1" ;;
    esac
done
[ -n "$CACHE" ] || CACHE=$(image_cache)

need_tools "this needs a Debian system" dpkg-query sha256sum ldd readelf
qemu_identify "$QEMU"
qemu_firmware "$QEMU"
QVERSION=$("$QBIN" --version | head -n1)
PLUGIN_SCRIPT="$HERE/build-qemu-plugin.sh"
PKEY_JSON=$(sh "$PLUGIN_SCRIPT" --key --qemu "$QEMU") \
    || die "the plugin's key (build-qemu-plugin.sh --key) failed; see above"
PKEY=$(echo "$PKEY_JSON" | sed -n 's/.*"key":"\([0-9a-f]*\)".*/\1/p')
[ -n "$PKEY" ] || die "build-qemu-plugin.sh --key printed no key: $PKEY_JSON"
INTERP=$(elf_interp "$QBIN")
LOADER=${INTERP##*/}
LIBS=$(elf_libs "$QBIN")

inputs() {
    echo "blklab-key qemu-bundle 1"
    echo "qemu $QID $QVERSION"
    echo "plugin $PKEY"
    echo "loader $LOADER $(sha256 "$INTERP")"
    echo "$LIBS" | while read -r name path; do
        echo "lib $name $(sha256 "$path")"
    done
    qemu_firmware_inputs
    code_inputs
    qemu_lib_inputs
}
HASH=$(inputs | sha256)
OUT="$CACHE/qemu-bundle-$(echo "$HASH" | cut -c1-16)"
if [ "$KEY_ONLY" = 1 ]; then
    printf '{"key":"%s","dir":"%s","qemu":"%s"}\n' "$HASH" "$(basename "$OUT")" "$(jstr "$QID")"
    exit 0
fi

cached() { output_matches "$OUT" libexec/qemu-system-x86_64 qemu_sha256 "$HASH"; }
if cached; then
    log "cached: $OUT"
    echo "$OUT"
    exit 0
fi

# --- the plugin (a cache hit, or built now: apt and gcc) -------------------------------------
SO=$(sh "$PLUGIN_SCRIPT" --qemu "$QEMU" --cache "$CACHE") \
    || die "the instruction-count plugin (build-qemu-plugin.sh) failed; see above"
[ -f "$SO" ] || die "build-qemu-plugin.sh printed $SO, which is not a file"
[ "$(json_field "$(dirname "$SO")/manifest.json" inputs_hash)" = "$PKEY" ] \
    || die "$SO is not the plugin of key $PKEY"
# The plugin's own libraries (libc; glib comes from QEMU) go in too.
LIBS=$(elf_libs "$QBIN" "$SO")

mkdir -p "$CACHE" || die "cannot create the cache directory $CACHE (choose another with --cache DIR)"
CACHE=$(cd "$CACHE" && pwd)
OUT="$CACHE/${OUT##*/}"
exec 8>"$CACHE/.prepare.lock"
if ! flock -n 8; then
    log "waiting for another user of $CACHE (.prepare.lock)"
    flock 8
fi
if cached; then
    log "cached: $OUT (built meanwhile)"
    echo "$OUT"
    exit 0
fi
T0=$(date +%s)
STAGE=$(mktemp -d "$CACHE/.qemu-bundle.XXXXXX")
# shellcheck disable=SC2016  # expanded when the trap runs
on_exit 'rm -rf "$STAGE"'

# --- the files ---------------------------------------------------------------------------------
mkdir -p "$STAGE/bin" "$STAGE/libexec" "$STAGE/lib" "$STAGE/share/qemu" "$STAGE/plugin"
cp -L "$QBIN" "$STAGE/libexec/qemu-system-x86_64"
cp -L "$INTERP" "$STAGE/lib/$LOADER"
echo "$LIBS" | while read -r name path; do
    cp -L "$path" "$STAGE/lib/$name" && chmod 644 "$STAGE/lib/$name" || exit 1
done || die "cannot copy QEMU's libraries into $STAGE/lib"
for p in $FWPATHS; do
    cp -L "$p" "$STAGE/share/qemu/${p##*/}"
    chmod 644 "$STAGE/share/qemu/${p##*/}"
done
cp "$SO" "$STAGE/plugin/libblklab-insns.so"
cat > "$STAGE/bin/qemu-system-x86_64" <<EOF
#!/bin/sh
# blklab's QEMU bundle (images/build-qemu-bundle.sh): $QVERSION,
# started through the bundle's own ELF loader and libraries, never the
# host's, with the bundle's firmware first on QEMU's data path. exec: the
# QEMU process is this one.
b=\$(dirname "\$(readlink -f "\$0")")
b=\${b%/*}
exec "\$b/lib/$LOADER" --library-path "\$b/lib" "\$b/libexec/qemu-system-x86_64" -L "\$b/share/qemu" "\$@"
EOF
chmod 755 "$STAGE/bin/qemu-system-x86_64" "$STAGE/libexec/qemu-system-x86_64" "$STAGE/lib/$LOADER"
chmod 644 "$STAGE/plugin/libblklab-insns.so"

# --- checks: the bundle's loader and libraries alone, firmware, plugin -------------------------
for b in "$STAGE/libexec/qemu-system-x86_64" "$STAGE/plugin/libblklab-insns.so"; do
    LIST=$("$STAGE/lib/$LOADER" --library-path "$STAGE/lib" --list "$b" 2>&1) \
        || die "the bundle's loader cannot load $b: $LIST"
    OUTSIDE=$(echo "$LIST" | awk -v lib="$STAGE/lib/" '$2 == "=>" && index($3, lib) != 1 { print $1 " => " $3 }')
    [ -z "$OUTSIDE" ] || die "the bundle's loader takes libraries of $b from outside the bundle: $OUTSIDE"
done
WRAP="$STAGE/bin/qemu-system-x86_64"
GOT=$("$WRAP" --version 2>&1 | head -n1) || true
[ "$GOT" = "$QVERSION" ] || die "the bundle's QEMU prints \"$GOT\", not \"$QVERSION\""
DATA=$("$WRAP" -L help 2>&1) || die "the bundle's QEMU fails -L help: $DATA"
[ "$(echo "$DATA" | head -n1)" = "$STAGE/share/qemu" ] \
    || die "the bundle's QEMU does not look in $STAGE/share/qemu first: $DATA"
if ! LOAD=$(echo quit | "$WRAP" -accel tcg -machine none -display none -nodefaults \
        -monitor stdio -plugin "$STAGE/plugin/libblklab-insns.so" 2>&1); then
    die "the bundle's QEMU does not load the plugin: $LOAD"
fi

# --- manifest, install ---------------------------------------------------------------------------
LIBS_JSON=$(echo "$LIBS" | while read -r name path; do
        pkg=$(dpkg-query -S "$path" 2>/dev/null | head -n1 | cut -d: -f1 || true)
        [ -n "$pkg" ] || pkg=$(dpkg-query -S "$(readlink -f "$path")" 2>/dev/null | head -n1 | cut -d: -f1 || true)
        ver=""
        [ -z "$pkg" ] || ver=$(pkgver "$pkg")
        printf '{"name": "%s", "from": "%s", "package": "%s", "package_version": "%s", "sha256": "%s"}\n' \
            "$name" "$(jstr "$path")" "$pkg" "$(jstr "$ver")" "$(sha256 "$STAGE/lib/$name")"
    done | awk '{ printf "%s\n    %s", (n++ ? "," : ""), $0 }')
qpkg_json=null; qver_json=null
if [ -n "$QPKG" ]; then qpkg_json="\"$QPKG\""; qver_json="\"$(jstr "$QPKGVER")\""; fi
SIZE=$(find "$STAGE" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
cat > "$STAGE/manifest.json" <<EOF
{
  "kind": "qemu-bundle",
  "qemu_path": "$(jstr "$QBIN")",
  "qemu_package": $qpkg_json,
  "qemu_package_version": $qver_json,
  "qemu_version": "$(jstr "$QVERSION")",
  "qemu_sha256": "$(sha256 "$STAGE/libexec/qemu-system-x86_64")",
  "loader": {"name": "$LOADER", "from": "$(jstr "$INTERP")", "package": "libc6", "package_version": "$(jstr "$(pkgver libc6)")"},
  "libraries": [$LIBS_JSON
  ],
  "firmware": [$(firmware_json)],
  "plugin_key": "$PKEY",
  "plugin_sha256": "$(sha256 "$STAGE/plugin/libblklab-insns.so")",
  "size": $SIZE,
  "inputs_hash": "$HASH",
  "built_at": "$(utc_now)"
}
EOF
inputs > "$STAGE/inputs"
chmod 755 "$STAGE"
if [ -e "$OUT" ]; then
    log "replacing $OUT (another recipe's, stale or incomplete)"
    mv "$OUT" "$STAGE.old"
fi
mv "$STAGE" "$OUT"
rm -rf "$STAGE.old"
log "built $OUT in $(( $(date +%s) - T0 ))s: $(echo "$LIBS" | wc -l) libraries, $(du -sh "$OUT" | cut -f1), $QID"
echo "$OUT"
