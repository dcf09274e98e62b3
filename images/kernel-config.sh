# shellcheck shell=sh
# images/kernel-config.sh: the guest kernel configuration, shared by
# build-kernel.sh (Debian's linux-source trees) and build-tree.sh (a
# kernel developer's own tree, `blklab bisect`), so that both build with
# exactly the same configuration and checks. POSIX sh; sourced after
# lib.sh, never run.
#
#   kconfig_fragments SERIES   sets FRAGMENT (images/kernel/guest.config)
#                              and SERIES_FRAGMENT (guest-SERIES.config or "")
#   kconfig_key                the key of that configuration (fragments' sha256)
#   kconfig_configure TREE LOG make tinyconfig, merge the fragments, make
#                              olddefconfig (output in LOG; dies on failure)
#   kconfig_check TREE SERIES  every option of the fragments against
#                              TREE/.config; dies with the list of misses
#   kconfig_make TREE LOG JOBS TARGET...  the build, with progress lines
#   kconfig_stage TREE OUT LOGDIR KVER    the outputs laid out in STAGE
#
# The caller defines kmake (make -C TREE ARCH=x86_64 with its environment).
# Functions' own variables are named kc_*.

# kconfig_fragments SERIES: the fragments for SERIES.
kconfig_fragments() {
    FRAGMENT="$HERE/kernel/guest.config"
    [ -f "$FRAGMENT" ] || die "$FRAGMENT missing (the kernel configuration fragment)"
    # What one series needs on top (e.g. guest-5.10.config), merged after
    # FRAGMENT and checked the same way; most series have none.
    SERIES_FRAGMENT="$HERE/kernel/guest-$1.config"
    [ -f "$SERIES_FRAGMENT" ] || SERIES_FRAGMENT=""
}

kconfig_key() {
    echo "tinyconfig+fragment-v1 $(sha256 "$FRAGMENT")${SERIES_FRAGMENT:+ $(sha256 "$SERIES_FRAGMENT")}"
}

# kconfig_configure TREE LOG
kconfig_configure() {
    log "configuring: make tinyconfig + $(basename "$FRAGMENT")${SERIES_FRAGMENT:+ + $(basename "$SERIES_FRAGMENT")} + olddefconfig"
    {
        kmake tinyconfig &&
        (cd "$1" && scripts/kconfig/merge_config.sh -m .config "$FRAGMENT" ${SERIES_FRAGMENT:+"$SERIES_FRAGMENT"}) &&
        kmake olddefconfig
    } > "$2" 2>&1 || {
        tail -n 20 "$2" >&2
        die "configuring $1 failed; full log: $2"
    }
}

# kconfig_verify TREE FRAGMENT: print every option of FRAGMENT whose value
# in TREE/.config differs from the requested one, and every line of it that
# does not parse. An option FRAGMENT wants "not set" that .config does not
# have at all passes (the kernel has no such option: SLOB on 6.12); one it
# wants set fails.
kconfig_verify() {
    awk -v frag="$2" '
        FNR == NR {
            if (match($0, /^CONFIG_[A-Za-z0-9_]+=/)) {
                have[substr($0, 1, RLENGTH - 1)] = substr($0, RLENGTH + 1)
            } else if ($0 ~ /^# CONFIG_[A-Za-z0-9_]+ is not set$/) {
                have[$2] = "n"
            }
            next
        }
        /^[ \t]*$/ { next }
        /^# CONFIG_[A-Za-z0-9_]+ is not set[ \t]*$/ {
            if ($2 in line) printf "  %s:%d: %s again (first on line %d)\n", frag, FNR, $2, line[$2]
            else line[$2] = FNR
            if (($2 in have) && have[$2] != "n") {
                printf "  %s: wanted not set, got %s\n", $2, have[$2]
            }
            next
        }
        /^#/ { next }
        match($0, /^CONFIG_[A-Za-z0-9_]+=/) {
            name = substr($0, 1, RLENGTH - 1)
            want = substr($0, RLENGTH + 1)
            sub(/[ \t]+$/, "", want)
            if (name in line) printf "  %s:%d: %s again (first on line %d)\n", frag, FNR, name, line[name]
            else line[name] = FNR
            if (!(name in have)) {
                printf "  %s: wanted %s, got nothing (no such option, or its dependencies are not met)\n", name, want
            } else if (have[name] != want) {
                printf "  %s: wanted %s, got %s\n", name, want, (have[name] == "n" ? "not set" : have[name])
            }
            next
        }
        { printf "  %s:%d: cannot parse: %s\n", frag, FNR, $0 }
    ' "$1/.config" "$2"
}

# kconfig_check TREE SERIES: kconfig_verify for every fragment; dies with
# the list when an option did not get its value. The caller may define
# kconfig_failed (called first, e.g. to forget a recorded configuration).
kconfig_check() {
    for kc_frag in "$FRAGMENT" ${SERIES_FRAGMENT:+"$SERIES_FRAGMENT"}; do
        kc_bad=$(kconfig_verify "$1" "$kc_frag")
        [ -n "$kc_bad" ] || continue
        if command -v kconfig_failed >/dev/null 2>&1; then kconfig_failed; fi
        kc_n=$(echo "$kc_bad" | wc -l)
        log "these options of $kc_frag did not get the requested value after make olddefconfig:"
        echo "$kc_bad" >&2
        die "$kc_n option(s) of images/kernel/$(basename "$kc_frag") were dropped or changed by Kconfig; add their missing dependencies to images/kernel/$(basename "$kc_frag") (see each option's 'depends on' in the Kconfig files of $1), or move an option only $2 has to images/kernel/guest-$2.config"
    done
}

# kconfig_full_steps TREE: the build steps (kbuild's "  CC ", "  LD ", ...
# lines) a full build of TREE is expected to take: the tree's own last
# full build (TREE/.blklab/full-build), else images/kernel/build-steps for
# the tree's VERSION.PATCHLEVEL (measured here with this configuration);
# nothing when neither knows.
kconfig_full_steps() {
    if [ -f "$1/.blklab/full-build" ]; then
        sed -n 's/^steps \([0-9][0-9]*\)$/\1/p' "$1/.blklab/full-build" | head -n1
        return 0
    fi
    kc_v=$(sed -n 's/^VERSION = \([0-9]*\)$/\1/p' "$1/Makefile" 2>/dev/null | head -n1)
    kc_p=$(sed -n 's/^PATCHLEVEL = \([0-9]*\)$/\1/p' "$1/Makefile" 2>/dev/null | head -n1)
    [ -n "$kc_v" ] && [ -n "$kc_p" ] || return 0
    awk -v s="$kc_v.$kc_p" '$1 == s && $2 ~ /^[0-9]+$/ { print $2; exit }' \
        "$HERE/kernel/build-steps" 2>/dev/null
}

# kconfig_progress ELAPSED DONE TOTAL: "D of ~T build steps (P %), ~Ns
# left" for a full build with an expected TOTAL, else "D build steps".
kconfig_progress() {
    if [ -n "$3" ] && [ "$3" -gt 0 ] && [ "$2" -gt 0 ]; then
        if [ "$2" -lt "$3" ]; then
            echo "$2 of ~$3 build steps ($(( $2 * 100 / $3 )) %), ~$(( $1 * ($3 - $2) / $2 ))s left"
        else
            echo "$2 of ~$3 build steps (finishing)"
        fi
    else
        echo "$2 build steps"
    fi
}

# kconfig_make TREE LOG JOBS TARGET...: make TARGET... in a session of its
# own (setsid; its pid in MAKE_PID, for the caller's clean-up to kill the
# group), output in LOG, a progress line on stderr every 10 s: elapsed,
# objects compiled, build steps done of those expected and an estimate of
# the time left (a full build, i.e. no vmlinux in TREE yet: the expected
# steps from kconfig_full_steps; an incremental one: steps so far), the
# current step. After a full build, TREE/.blklab/full-build records its
# steps and seconds for the next estimate. Sets MAKE_SECS; dies with the
# log's tail on failure. kmake's environment is KMAKE_ENV (words).
kconfig_make() {
    kc_tree=$1; kc_log=$2; kc_jobs=$3; shift 3
    kc_m0=$(date +%s)
    kc_total=""
    kc_full=0
    if [ ! -f "$kc_tree/vmlinux" ]; then
        kc_full=1
        kc_total=$(kconfig_full_steps "$kc_tree")
        if [ -n "$kc_total" ]; then
            log "a full build: about $kc_total build steps"
        else
            log "a full build (no earlier full build of this tree to estimate its length from)"
        fi
    fi
    # shellcheck disable=SC2086  # KMAKE_ENV: NAME=VALUE words
    (
        exec setsid env $KMAKE_ENV KBUILD_BUILD_TIMESTAMP="$TS" \
            make -C "$kc_tree" --no-print-directory ARCH=x86_64 -j"$kc_jobs" "$@"
    ) > "$kc_log" 2>&1 &
    MAKE_PID=$!
    kc_next=$((kc_m0 + 10))
    while kill -0 "$MAKE_PID" 2>/dev/null; do
        sleep 1
        if [ "$(date +%s)" -ge "$kc_next" ]; then
            kc_next=$(( $(date +%s) + 10 ))
            kc_cc=$(grep -c '^  CC ' "$kc_log" || true)
            kc_steps=$(grep -c '^  [A-Z]' "$kc_log" || true)
            kc_last=$(grep '^  [A-Z]' "$kc_log" | tail -n1 | sed 's/^ *//; s/  */ /g')
            kc_el=$(( $(date +%s) - kc_m0 ))
            log "${kc_el}s: $kc_cc objects compiled, $(kconfig_progress "$kc_el" "$kc_steps" "$kc_total") (${kc_last:-starting})"
        fi
    done
    kc_rc=0
    wait "$MAKE_PID" || kc_rc=$?
    MAKE_PID=""
    MAKE_SECS=$(( $(date +%s) - kc_m0 ))
    if [ "$kc_rc" -ne 0 ]; then
        tail -n 30 "$kc_log" >&2
        die "make $* failed (exit $kc_rc) after ${MAKE_SECS}s; full log: $kc_log"
    fi
    kc_steps=$(grep -c '^  [A-Z]' "$kc_log" || true)
    log "make done in ${MAKE_SECS}s ($(grep -c '^  CC ' "$kc_log" || true) objects compiled, $kc_steps build steps)"
    if [ "$kc_full" = 1 ] && [ -d "$kc_tree/.blklab" ]; then
        printf 'steps %s\nseconds %s\n' "$kc_steps" "$MAKE_SECS" > "$kc_tree/.blklab/full-build"
    fi
}

# kconfig_stage TREE OUT LOGDIR KVER: a new directory beside OUT, in STAGE
# (the caller's exit trap removes it; the caller renames it to OUT), with
# TREE's bzImage as vmlinuz, System.map, .config as config and the modules
# (make modules_install, stripped; log in LOGDIR) under lib/modules/KVER,
# without the build and source links back into TREE.
kconfig_stage() {
    mkdir -p "$(dirname "$2")"
    STAGE=$(mktemp -d "$2.new.XXXXXX")
    chmod 755 "$STAGE"
    cp "$1/arch/x86/boot/bzImage" "$STAGE/vmlinuz"
    cp "$1/System.map" "$STAGE/System.map"
    cp "$1/.config" "$STAGE/config"
    kmake -s INSTALL_MOD_PATH="$STAGE" INSTALL_MOD_STRIP=1 modules_install > "$3/modules_install.log" 2>&1 || {
        tail -n 20 "$3/modules_install.log" >&2
        die "make modules_install failed; full log: $3/modules_install.log"
    }
    [ -d "$STAGE/lib/modules/$4" ] || die "modules_install made no lib/modules/$4"
    rm -f "$STAGE/lib/modules/$4/build" "$STAGE/lib/modules/$4/source"
}
