#!/usr/bin/env bash
# images/demo.sh: boot a QEMU guest whose disk is served by `blklab serve`, run
# fio in it and print the results. See `images/demo.sh --help`.
set -euo pipefail

LOG_NAME=demo
ARG_MISSING=die
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$REPO/images
# shellcheck source=images/lib.sh
. "$HERE/lib.sh"

# (--help prints this on stdout, unlike the usage of lib.sh)
usage() {
    cat <<'EOF'
usage: images/demo.sh [options]

Build blklab (cargo build --release), fetch Debian's kernel and build the
guest initramfs (cached, shared with tests/qemu_e2e.rs), start
`blklab serve` on a fresh socket, boot a QEMU guest (q35) with that disk as
/dev/vda and run fio in it (images/guest/demo-fio): 4k randread QD1,
randread QD16, randwrite QD16, then a 32M randwrite+crc32c verify pass.
Prints a table (IOPS, KiB/s, p50/p99 completion latency, guest CPU busy %)
and the daemon's per-queue request counters.

Options:
  --kernel 6.1|6.12    guest kernel series (default 6.12)
  --runtime SECONDS    length of each time-based fio run (default 5)
  --disk mem|null|file:PATH
                       blklab storage (default mem; null drops writes, so the
                       verify pass is skipped)
  --size SIZE          disk size (default 1G; for an existing file: its size)
  --num-queues N       virtqueues / guest blk-mq hardware queues (default 2)
  --keep               keep the temp dir (console.log, blklab.log, socket)
  -h, --help           this text

Environment:
  BLKLAB_ACCEL=kvm     use KVM (default TCG: tcg,thread=multi)
  BLKLAB_IMAGE_CACHE   image cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images)
  BLKLAB_QEMU_TIMEOUT  seconds before QEMU is killed (default 300 + 4 x runtime)

Needs (installed with apt-get when run as root): qemu-system-x86 fio
busybox-static cpio xz-utils kmod, plus cargo. Exit status is non-zero when
the guest script fails, fio reports errors or the verify pass fails.
EOF
}

KERNEL=6.12
RUNTIME=5
DISK=mem
SIZE=1G
NUM_QUEUES=2
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
    --kernel|--kernel=*) opt_value "$@"; KERNEL=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --runtime|--runtime=*) opt_value "$@"; RUNTIME=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --disk|--disk=*) opt_value "$@"; DISK=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --size|--size=*) opt_value "$@"; SIZE=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --num-queues|--num-queues=*) opt_value "$@"; NUM_QUEUES=$OPT_VALUE; shift "$OPT_SHIFT" ;;
    --keep) KEEP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done
case "$KERNEL" in 6.1|6.12) ;; *) die "--kernel must be 6.1 or 6.12, not '$KERNEL'" ;; esac
[[ "$RUNTIME" =~ ^[1-9][0-9]*$ ]] || die "--runtime must be a positive integer (seconds)"
[[ "$NUM_QUEUES" =~ ^[1-9][0-9]*$ ]] || die "--num-queues must be a positive integer"
case "$DISK" in mem|null|file:?*) ;; *) die "--disk must be mem, null or file:PATH" ;; esac

# --- 1. host packages --------------------------------------------------------------
missing=()
for tool in qemu-system-x86_64 fio busybox cpio xz insmod; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
# build-initramfs.sh needs the static busybox at /bin/busybox.
[ -x /bin/busybox ] || missing+=(/bin/busybox)
if [ ${#missing[@]} -gt 0 ]; then
    if is_root; then
        log "installing packages (missing: ${missing[*]})"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            qemu-system-x86 fio busybox-static cpio xz-utils kmod >/dev/null
    else
        die "missing: ${missing[*]}; run as root, or: sudo apt-get install qemu-system-x86 fio busybox-static cpio xz-utils kmod"
    fi
fi
command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust: https://rustup.rs)"

# --- 2. build ------------------------------------------------------------------------
log "cargo build --release"
if ! (cd "$REPO" && cargo build --release -q); then
    want=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$REPO/Cargo.toml")
    die "cargo build --release failed (needs Rust >= ${want:-?}, have $(rustc --version 2>/dev/null || echo 'no rustc'); Debian 12's own cargo is too old: use https://rustup.rs)"
fi
BLKLAB=$REPO/target/release/blklab
[ -x "$BLKLAB" ] || die "$BLKLAB missing after the build"

# --- 3. guest image (same paths as tests/qemu_e2e.rs prepare_guest) -------------------
CACHE=$(image_cache)
mkdir -p "$CACHE"
KDIR=$CACHE/kernel-$KERNEL
INITRD=$CACHE/initramfs-$KERNEL.cpio.gz
log "kernel $KERNEL and initramfs in $CACHE"
sh "$REPO/images/fetch-debian-kernel.sh" "$KERNEL" "$KDIR" </dev/null
sh "$REPO/images/build-initramfs.sh" --kernel-dir "$KDIR" --out "$INITRD" </dev/null
[ -f "$KDIR/vmlinuz" ] || die "$KDIR/vmlinuz missing after fetch"
[ -f "$INITRD" ] || die "$INITRD missing after build"

# --- 4. daemon -----------------------------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/blklab-demo.XXXXXX")
DAEMON_PID=""
QEMU_PID=""
cleanup() {
    if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
        kill "$QEMU_PID" 2>/dev/null || true
    fi
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
    fi
    if [ "$KEEP" = 1 ]; then
        log "kept $TMP"
    else
        rm -rf "$TMP"
    fi
}
on_exit cleanup

SOCK=$TMP/vd.sock
DISK_ARGS=(--socket "$SOCK" --disk "$DISK" --num-queues "$NUM_QUEUES" --queue-size 256)
if [[ "$DISK" != file:* ]] || [ ! -e "${DISK#file:}" ]; then
    DISK_ARGS+=(--size "$SIZE")
fi

QARGS=$("$BLKLAB" serve "${DISK_ARGS[@]}" --print-qemu-args --guest-memory 1G) \
    || die "blklab serve --print-qemu-args failed"
mapfile -t QARG_LINES <<<"$QARGS"
QEMU_DISK_ARGS=()
for line in "${QARG_LINES[@]}"; do
    [ -n "$line" ] || continue
    QEMU_DISK_ARGS+=("${line%% *}")
    [ "$line" = "${line%% *}" ] || QEMU_DISK_ARGS+=("${line#* }")
done
[ ${#QEMU_DISK_ARGS[@]} -gt 0 ] || die "blklab serve --print-qemu-args printed nothing"

log "blklab serve ${DISK_ARGS[*]}"
# The report reads the per-queue summaries blklab logs at info level.
RUST_LOG=info "$BLKLAB" serve "${DISK_ARGS[@]}" >"$TMP/blklab.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 100); do
    [ -S "$SOCK" ] && break
    kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$TMP/blklab.log" >&2; die "blklab serve exited early"; }
    sleep 0.1
done
[ -S "$SOCK" ] || { cat "$TMP/blklab.log" >&2; die "no socket $SOCK after 10 s"; }

# --- 5. guest ------------------------------------------------------------------------
case "${BLKLAB_ACCEL:-tcg}" in
kvm) ACCEL=(-accel kvm -cpu host); ACCEL_NAME=kvm ;;
tcg|"") ACCEL_NAME="tcg,thread=multi"; ACCEL=(-accel "$ACCEL_NAME") ;;
*) die "BLKLAB_ACCEL=${BLKLAB_ACCEL}: expected kvm or tcg" ;;
esac
VERIFY=1
[ "$DISK" != null ] || VERIFY=0
APPEND="console=ttyS0 quiet blklab.run=demo-fio blklab.runtime=$RUNTIME blklab.verify=$VERIFY panic=-1"
QEMU_TIMEOUT=${BLKLAB_QEMU_TIMEOUT:-$((300 + 4 * RUNTIME))}
QEMU_CMD=(qemu-system-x86_64 "${ACCEL[@]}" -smp 2 -m 1G -machine q35 "${QEMU_DISK_ARGS[@]}"
    -nographic -no-reboot -nic none
    -kernel "$KDIR/vmlinuz" -initrd "$INITRD" -append "$APPEND")
log "booting ($ACCEL_NAME, timeout ${QEMU_TIMEOUT}s): ${QEMU_CMD[*]}"
START=$SECONDS
QEMU_RC=0
timeout "$QEMU_TIMEOUT" "${QEMU_CMD[@]}" </dev/null >"$TMP/console.log" 2>&1 &
QEMU_PID=$!
wait "$QEMU_PID" || QEMU_RC=$?
QEMU_PID=""
GUEST_SECS=$((SECONDS - START))

# --- 6. stop the daemon --------------------------------------------------------------
kill -TERM "$DAEMON_PID" 2>/dev/null || true
DAEMON_RC=0
wait "$DAEMON_PID" || DAEMON_RC=$?
DAEMON_PID=""

# --- 7. report -----------------------------------------------------------------------
# Drop carriage returns and the terminal escapes SeaBIOS prints.
CONSOLE=$(tr -d '\r' <"$TMP/console.log" | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g')
GUEST_KERNEL=$(sed -n 's/.*BLKLAB-INIT kernel=\([^ ]*\).*/\1/p' <<<"$CONSOLE" | head -n1)
END_LINE=$(grep -o 'BLKLAB-END demo-fio rc=[0-9]*' <<<"$CONSOLE" | head -n1 || true)
GUEST_RC=${END_LINE##*rc=}
DEMO_LINES=$(grep '^BLKLAB-DEMO name=' <<<"$CONSOLE" || true)

echo "blklab demo: kernel ${GUEST_KERNEL:-?} (Debian $KERNEL series), accel $ACCEL_NAME, -smp 2 -m 1G," \
    "disk $DISK, $NUM_QUEUES queues, ${RUNTIME}s per run, guest ran ${GUEST_SECS}s"
echo
if [ -n "$DEMO_LINES" ]; then
    awk '
        function v(k,   i, f) { for (i = 2; i <= NF; i++) { split($i, f, "="); if (f[1] == k) return f[2] } return "?" }
        BEGIN { printf "%-15s %9s %10s %9s %9s %7s %6s\n", "run", "IOPS", "KiB/s", "p50 us", "p99 us", "busy%", "errors" }
        { printf "%-15s %9s %10s %9s %9s %7s %6s\n", v("name"), v("iops"), v("bw_kib"),
              v("lat_p50_us"), v("lat_p99_us"), v("busy_pct"), v("errors") }
    ' <<<"$DEMO_LINES"
else
    echo "(no BLKLAB-DEMO lines on the guest console)"
fi
echo "(latency: fio completion latency percentiles; busy%: guest CPU, 100 - idle% over all vCPUs)"
echo
echo "blklab serve, per queue:"
grep -E 'queue [0-9]+:' "$TMP/blklab.log" | sed -e 's/^.*queue \([0-9]*\):/  queue \1:/' || echo "  (no per-queue summary in the daemon log)"

FAIL=()
[ "$QEMU_RC" -eq 0 ] || FAIL+=("qemu exited with $QEMU_RC$([ "$QEMU_RC" -ne 124 ] || echo " (timeout ${QEMU_TIMEOUT}s)")")
[ -n "$END_LINE" ] || FAIL+=("guest script did not finish (no BLKLAB-END)")
[ -z "$END_LINE" ] || [ "$GUEST_RC" = 0 ] || FAIL+=("guest script exited with rc=$GUEST_RC")
if [ -n "$DEMO_LINES" ] && grep -qv ' errors=0 ' <<<"$DEMO_LINES"; then
    FAIL+=("fio reported errors")
fi
if [ -n "$DEMO_LINES" ] && grep -v ' rc=0$' <<<"$DEMO_LINES" | grep -q .; then
    FAIL+=("fio exited non-zero")
fi
if [ "$VERIFY" = 1 ] && [ -n "$END_LINE" ] && ! grep -q '^BLKLAB-DEMO name=verify .* errors=0 .* rc=0$' <<<"$DEMO_LINES"; then
    FAIL+=("verify pass failed")
fi
[ "$DAEMON_RC" -eq 0 ] || FAIL+=("blklab serve exited with $DAEMON_RC")
if grep -qE '(ERROR|panicked)' "$TMP/blklab.log"; then
    FAIL+=("blklab serve logged errors")
fi

if [ ${#FAIL[@]} -gt 0 ]; then
    echo
    echo "FAILED:"
    printf '  - %s\n' "${FAIL[@]}"
    echo "--- guest console (last 60 lines) ---"
    tail -n 60 <<<"$CONSOLE"
    echo "--- blklab serve log (last 30 lines) ---"
    tail -n 30 "$TMP/blklab.log"
    [ "$KEEP" = 1 ] || log "rerun with --keep to keep $TMP"
    exit 1
fi
echo
echo "OK"
