# shellcheck shell=sh
# images/lib.sh: the preamble the images/ scripts share. POSIX sh; sourced,
# never run. A script sets its name, its usage line and its directory, then
# sources this file:
#
#   LOG_NAME=build-fio
#   USAGE="$0 --out DIR"
#   HERE=$(cd "$(dirname "$0")" && pwd)
#   # shellcheck source=images/lib.sh
#   . "$HERE/lib.sh"
#
# LOG_NAME prefixes every message ("build-fio: …", "build-fio: ERROR: …"),
# USAGE follows "usage: " in the usage text, HERE is the script's directory
# (images/). Sets SELF (the script), LIB (this file), DEBSRC, BACKPORTS,
# BULLSEYE and BULLSEYE_PIN (the apt files blklab adds), and appends
# /usr/sbin:/sbin to PATH.
#
# Every script that hashes its own code into a cache key hashes this file
# too (code_inputs): a change here rebuilds what it may change.
#
# POSIX sh has no `local`: the functions' own variables are named lib_*.

LOG_NAME=${LOG_NAME:?set LOG_NAME before sourcing images/lib.sh}
HERE=${HERE:?set HERE (the script directory) before sourcing images/lib.sh}
USAGE=${USAGE-}
SELF="$HERE/$(basename "$0")"
LIB="$HERE/lib.sh"
PATH=$PATH:/usr/sbin:/sbin
export PATH

# --- messages and arguments ------------------------------------------------------------

log() { echo "$LOG_NAME: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# usage: "usage: USAGE" on stderr, exit 2.
usage() { printf 'usage: %s\n' "$USAGE" >&2; exit 2; }
# unknown_arg ARG: "NAME: ERROR: unknown argument: ARG", then the usage.
unknown_arg() { log "ERROR: unknown argument: $1"; usage; }

# opt_value "$@": the value of the option in $1, given as `--opt VALUE` or
# `--opt=VALUE`. Sets OPT_VALUE, and OPT_SHIFT to how many arguments the
# caller shifts:
#   --out|--out=*) opt_value "$@"; OUT=$OPT_VALUE; shift "$OPT_SHIFT" ;;
# A `--opt` with no value left is handled by ARG_MISSING: "usage" (the
# default) the usage text; "error" a line "NAME: ERROR: --opt needs a value"
# and then the usage text; "die" only that line (exit 1).
opt_value() {
    # shellcheck disable=SC2034  # OPT_VALUE, OPT_SHIFT: for the caller
    case "$1" in
    --*=*) OPT_VALUE=${1#*=}; OPT_SHIFT=1 ;;
    *)
        if [ $# -lt 2 ]; then
            case "${ARG_MISSING:-usage}" in
            error) log "ERROR: $1 needs a value"; usage ;;
            die) die "$1 needs a value" ;;
            *) usage ;;
            esac
        fi
        OPT_VALUE=$2; OPT_SHIFT=2
        ;;
    esac
}

# need_tools HINT TOOL...: die at the first TOOL not on PATH,
# "TOOL not found (HINT)".
need_tools() {
    lib_hint=$1; shift
    for lib_tool in "$@"; do
        command -v "$lib_tool" >/dev/null 2>&1 || die "$lib_tool not found ($lib_hint)"
    done
}

is_root() { [ "$(id -u)" -eq 0 ]; }

# image_cache: the default image cache directory.
image_cache() { echo "${BLKLAB_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images}"; }

# --- files, hashes, JSON ------------------------------------------------------------------

# sha256 [FILE]: the hex sha256 of FILE, or of stdin without one.
sha256() { sha256sum "$@" | cut -d' ' -f1; }
# code_inputs: the inputs-hash lines of the code itself, the script and this
# file.
code_inputs() {
    echo "script $(sha256 "$SELF")"
    echo "lib $(sha256 "$LIB")"
}
# hash_dir DIR: a line "PATH x|- SHA256" for every file below DIR
# (path-relative, sorted): its contents and whether it is executable (not
# the other mode bits, which a checkout's umask decides).
hash_dir() {
    (cd "$1" && find . -type f | LC_ALL=C sort | while read -r lib_f; do
        lib_x=-
        [ ! -x "$lib_f" ] || lib_x=x
        printf '%s %s %s\n' "$lib_f" "$lib_x" "$(sha256sum "$lib_f" | cut -d' ' -f1)"
    done)
}
# json_field FILE KEY: the string value of "KEY": "..." in FILE.
json_field() { sed -n "s/.*\"$2\": *\"\([^\"]*\)\".*/\1/p" "$1" 2>/dev/null | head -n1; }
# jstr STRING: STRING as the body of a JSON string.
jstr() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
# json_list: the words of stdin as the items of a JSON list of strings
# ("a", "b"), without the brackets.
json_list() { awk '{ for (i = 1; i <= NF; i++) printf "%s\"%s\"", (n++ ? ", " : ""), $i }'; }
utc_now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
# first PATH...: the first PATH that exists, as a file or a link (of a glob:
# its first match); nothing when none does.
first() {
    for lib_path in "$@"; do
        if [ -e "$lib_path" ] || [ -L "$lib_path" ]; then
            echo "$lib_path"
            return 0
        fi
    done
    return 0
}
# ldd_names BINARY: the file names of the libraries BINARY links, sorted.
ldd_names() {
    ldd "$1" | awk '/=>/ {print $1; next} /^[ \t]*\// {print $1}' | sed 's,.*/,,' | LC_ALL=C sort -u
}
# patch_names: the NAMEs of images/patches/NAME.patch, space-separated.
patch_names() {
    lib_names=""
    for lib_path in "$HERE"/patches/*.patch; do
        [ -f "$lib_path" ] || continue
        lib_path=${lib_path##*/}
        lib_names="$lib_names ${lib_path%.patch}"
    done
    echo "${lib_names# }"
}

# --- output directories -----------------------------------------------------------------

# output_matches DIR FILE KEY HASH: DIR/manifest.json records inputs_hash
# HASH and, under KEY, the sha256 DIR/FILE has.
output_matches() {
    [ -f "$1/manifest.json" ] && [ -f "$1/$2" ] \
        && [ "$(json_field "$1/manifest.json" inputs_hash)" = "$4" ] \
        && [ "$(json_field "$1/manifest.json" "$3")" = "$(sha256 "$1/$2")" ]
}
# refuse_foreign DIR FILE [HINT]: die when DIR has files but neither a
# manifest.json nor FILE, i.e. this script did not make it.
refuse_foreign() {
    if [ -e "$1" ] && [ -n "$(ls -A "$1" 2>/dev/null)" ] \
       && [ ! -e "$1/manifest.json" ] && [ ! -e "$1/$2" ]; then
        die "$1 is not empty and was not made by this script; refusing to overwrite it${3:+ ($3)}"
    fi
}
# on_exit COMMAND: run COMMAND when the script exits; SIGINT and SIGTERM
# exit 130 and 143 (running it too).
on_exit() {
    # shellcheck disable=SC2064  # COMMAND is the trap's text, as with trap
    trap "$1" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}
# work_dir NAME: WORK, a new directory ${TMPDIR:-/tmp}/blklab-NAME.XXXXXX,
# removed on exit.
work_dir() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/blklab-$1.XXXXXX")
    # shellcheck disable=SC2016  # $WORK is expanded when the trap runs
    on_exit 'rm -rf "$WORK"'
}
# apt_work NAME: work_dir NAME, a directory apt's _apt user may enter.
apt_work() {
    work_dir "$1"
    chmod 755 "$WORK"   # apt-get source/download may drop privileges to _apt
}

# --- Debian packages ----------------------------------------------------------------------

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
pkgver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo none; }
# dep_versions PKG...: an inputs-hash line "dep PKG VERSION" per PKG.
dep_versions() {
    for lib_pkg in "$@"; do
        echo "dep $lib_pkg $(pkgver "$lib_pkg")"
    done
}
# candidate PKG: the version apt would install; "(none)" or nothing when
# there is none (have_version tells).
candidate() { apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | head -n1; }
have_version() {
    case "$1" in
    ''|'(none)') return 1 ;;
    esac
}
# source_series: the SERIES of Debian's linux-source-SERIES packages apt
# knows, oldest first, space-separated; nothing without apt lists.
source_series() {
    apt-cache search --names-only '^linux-source-[0-9.]*$' 2>/dev/null | cut -d' ' -f1 \
        | sed 's/^linux-source-//' | sort -V | tr '\n' ' ' | sed 's/ $//'
}
# source_hint SERIES: where linux-source-SERIES comes from and how to get
# it, for an error message when apt does not have it.
source_hint() {
    case "$1" in
    5.10) echo "linux-source-5.10 is Debian 11's, from bullseye-security: run .ci/install-deps as root, which adds $BULLSEYE, pinned by $BULLSEYE_PIN so that nothing else comes from bullseye" ;;
    6.1) echo "linux-source-6.1 is in Debian 12's bookworm: check /etc/apt/sources.list.d and run apt-get update" ;;
    6.12) echo "linux-source-6.12 is in Debian 12's bookworm-security: check /etc/apt/sources.list.d and run apt-get update" ;;
    *) echo "Debian 12 has 6.1 in bookworm and 6.12 in bookworm-security; 5.10 comes from bullseye-security (.ci/install-deps adds it, pinned to that one package)" ;;
    esac
}
# src_version PKG: the newest version of source package PKG apt knows
# (deb-src); nothing when none.
src_version() { apt-cache showsrc "$1" 2>/dev/null | sed -n 's/^Version: *//p' | sort -V | tail -n1; }

# install_build_deps PKG...: install the PKGs that are not installed, with
# apt-get as root (after an apt-get update when the first try fails); not
# root: die naming the command.
install_build_deps() {
    lib_missing=""
    for lib_pkg in "$@"; do
        installed "$lib_pkg" || lib_missing="$lib_missing $lib_pkg"
    done
    [ -n "$lib_missing" ] || return 0
    is_root || die "missing build dependencies; run as root: apt-get install --no-install-recommends$lib_missing"
    log "installing build dependencies:$lib_missing"
    # shellcheck disable=SC2086  # a list of package names, split on purpose
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $lib_missing >&2; then
        update_and_retry "apt-get install"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $lib_missing >&2 \
            || die "apt-get install$lib_missing failed"
    fi
}

# update_and_retry WHAT: WHAT failed, maybe for old apt lists: say so,
# run apt-get update (die when it fails), and let the caller retry.
update_and_retry() {
    log "$1 failed; running apt-get update and retrying"
    apt-get update -qq >&2 || die "apt-get update failed"
}

# apt_download DIR PKG=VERSION: apt-get download into DIR, its messages to
# stderr; prints the .deb's path, nothing when apt-get made none.
apt_download() {
    ( cd "$1" && apt-get download -q "$2" 2>&1 | grep -v 'unsandboxed as root' >&2 ) || true
    first "$1"/*.deb
}

# The apt sources files blklab adds, one each, so that no entry is made
# twice. BACKPORTS is the one .ci/install-deps writes (it runs before the
# repository's scripts and keeps its own copy of the text: keep the two the
# same).
DEBSRC=/etc/apt/sources.list.d/blklab-deb-src.sources
BACKPORTS=/etc/apt/sources.list.d/blklab-backports.sources
# bullseye-security for linux-source-5.10 and its pin: only .ci/install-deps
# writes them (named here for the error messages).
BULLSEYE=/etc/apt/sources.list.d/blklab-bullseye-security.sources
BULLSEYE_PIN=/etc/apt/preferences.d/blklab-bullseye-security

# ensure_deb_src PKG: when apt knows no source of PKG, add DEBSRC (deb-src
# of bookworm and bookworm-updates; as root) unless it is there, and run
# apt-get update.
ensure_deb_src() {
    [ -z "$(src_version "$1")" ] || return 0
    if [ ! -f "$DEBSRC" ]; then
        is_root || die "apt has no deb-src entry for $1; as root, add one (see $SELF) or run this script as root"
        log "adding a deb-src entry: $DEBSRC"
        cat > "$DEBSRC" <<'EOF'
# Added by blklab images/lib.sh (build-fio.sh, build-qemu-plugin.sh):
# source packages, for apt-get source.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    fi
    log "running apt-get update (source lists)"
    apt-get update -qq >&2 || die "apt-get update failed (check the network and $DEBSRC)"
}

# has_suite SUITE: an entry of apt's sources names SUITE.
has_suite() {
    grep -qs "^[^#]*$1" /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list.d/*.sources
}
# add_backports: write BACKPORTS, bookworm-backports with deb and deb-src
# (the same text as .ci/install-deps writes).
add_backports() {
    cat > "$BACKPORTS" <<'EOF'
# Added by blklab (.ci/install-deps, images/lib.sh): QEMU 10.0
# (qemu-system-x86, qemu-utils) and its source package come from
# bookworm-backports, and images/fetch-debian-kernel.sh looks here for 6.12
# kernels. Backports are NotAutomatic: nothing else is taken from here
# unless asked for.
Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
}

# --- cache keys ---------------------------------------------------------------------------
# Every cached artifact is named by a key made only of what this repository
# holds: the recipe (the script and this file), the configuration
# fragments, the patch, the series, the guest scripts. No apt lists, no
# network, no compiler: a key is known before anything is built, and a
# cache restored on another machine (or `blklab images import`) is a hit.
# What was actually built (the Debian source version, the compiler) is
# pinned in the artifact's manifest.json, not in its key.

# recipe SCRIPT...: the key lines of images/SCRIPT... and of this file.
recipe() {
    for lib_f in "$@"; do
        echo "recipe $lib_f $(sha256 "$HERE/$lib_f")"
    done
    echo "lib $(sha256 "$LIB")"
}
# key_fio, key_mpstat: the keys of build-fio.sh's and fetch-sysstat.sh's
# outputs.
key_fio() { { echo "blklab-key fio 2"; recipe build-fio.sh; } | sha256; }
key_mpstat() { { echo "blklab-key mpstat 2"; recipe fetch-sysstat.sh; } | sha256; }
# key_debian_kernel SERIES: the key of fetch-debian-kernel.sh SERIES.
key_debian_kernel() {
    { echo "blklab-key debian-kernel 2"; echo "series $1"; recipe fetch-debian-kernel.sh; } | sha256
}
# key_build_kernel SERIES [PATCH]: the key of build-kernel.sh --series
# SERIES [--patch PATCH] (PATCH must exist): the recipe, the configuration
# fragments, the series and the patch; not the Debian upload of
# linux-source-SERIES (the manifest records it as source_version). A file
# the build's recipe is read from belongs here.
key_build_kernel() {
    {
        echo "blklab-key build-kernel 2"
        echo "series $1"
        recipe build-kernel.sh
        echo "kernel-config $(sha256 "$HERE/kernel-config.sh")"
        echo "fragment $(sha256 "$HERE/kernel/guest.config")"
        if [ -f "$HERE/kernel/guest-$1.config" ]; then
            echo "series-fragment $(sha256 "$HERE/kernel/guest-$1.config")"
        fi
        if [ -n "${2:-}" ]; then
            echo "patch $2 $(sha256 "$HERE/patches/$2.patch")"
        else
            echo "patch none"
        fi
    } | sha256
}
# key_initramfs KERNEL FIO MPSTAT GUEST_SCRIPTS_DIR EXTRA_DIR: the key of a
# build-initramfs.sh output. KERNEL, FIO and MPSTAT identify the inputs
# ("key KEY" for an artifact of this cache, "sha256 SHA" for anything
# else, "none"); the dirs may be empty. The host's busybox and dmsetup are
# not in it (the manifest records their sha256).
key_initramfs() {
    {
        echo "blklab-key initramfs 3"
        recipe build-initramfs.sh
        echo "init $(sha256 "$HERE/initramfs/init")"
        [ ! -d "$HERE/guest" ] || hash_dir "$HERE/guest" | sed 's/^/guest /'
        echo "kernel $1"
        echo "fio $2"
        echo "mpstat $3"
        [ -z "$4" ] || hash_dir "$4" | sed 's/^/guest-scripts /'
        [ -z "$5" ] || hash_dir "$5" | sed 's/^/extra /'
    } | sha256
}
# artifact_id FILE: "key KEY" when FILE is the output of one of these
# scripts (DIR/manifest.json beside it records its inputs_hash and sha256),
# else "sha256 SHA" of FILE.
artifact_id() {
    lib_sha=$(sha256 "$1")
    lib_m="$(dirname "$1")/manifest.json"
    lib_key=$(json_field "$lib_m" inputs_hash)
    if [ -n "$lib_key" ] && [ "$(json_field "$lib_m" sha256)" = "$lib_sha" ]; then
        echo "key $lib_key"
    else
        echo "sha256 $lib_sha"
    fi
}
# kernel_id DIR: "key KEY" of a kernel directory whose manifest records
# its inputs_hash, else "sha256 SHA" of its manifest.json.
kernel_id() {
    lib_key=$(json_field "$1/manifest.json" inputs_hash)
    if [ -n "$lib_key" ]; then
        echo "key $lib_key"
    else
        echo "sha256 $(sha256 "$1/manifest.json")"
    fi
}
# kernel_cached DIR KEY: DIR is a kernel made with KEY (its manifest
# records it as inputs_hash and the sha256 of its vmlinuz).
kernel_cached() { output_matches "$1" vmlinuz vmlinuz_sha256 "$2"; }
