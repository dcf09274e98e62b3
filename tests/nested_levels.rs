//! The instruction-count plugin's level split on real emulated hardware: a
//! busy loop in a KVM guest counts as level 2 (the guest), one in the host
//! as level 1 (the host), each to the instruction.
//!
//! The nested host boots as tests/common/nested_boot.rs describes, once
//! with one vCPU under `-icount` (as `--deterministic` runs it), once with
//! two vCPUs on two threads. Its run binary is
//! `tests/fixtures/nested-levels/levels.c`: it creates a KVM VM whose
//! one real-mode vCPU counts `ecx` down from [`GUEST_ITERATIONS`] and halts,
//! and runs its own loop of [`HOST_ITERATIONS`] after it, printing a
//! `LEVELS …` line before and after each loop and waiting for `go` after
//! each line. At each line the test takes a plugin dump, then answers: the
//! guest's window is the dump at `guest-end` since the one at
//! `guest-begin`, the host's likewise.
//!
//! Needs QEMU (qemu-system-x86_64 with TCG's SVM), gcc with a static libc
//! (`.ci/install-deps`), and builds or reuses the plugin and the host image
//! in the shared image cache (`BLKLAB_IMAGE_CACHE` overrides it; the host
//! image is a few minutes to build the first time). About 20 s a boot once
//! cached; two boots (one vCPU, two vCPUs).
//!
//! Run: `cargo test --test nested_levels -- --nocapture`

mod common;

use std::time::Duration;

use blklab::lab::measure::plugin::{ExitKind, LevelRule};

use common::nested_boot::{run, summary, Dumps, Machine, Program};

/// The guest's loop: `dec ecx; jnz` this many times.
const GUEST_ITERATIONS: u64 = 3_000_000;

/// The host's loop: `dec; jnz` on a register this many times. Not
/// [`GUEST_ITERATIONS`], so counts landing in the other loop's window
/// show.
const HOST_ITERATIONS: u64 = 5_000_000;

/// Everything the guest executes: `mov ecx, N`, N times `dec ecx; jnz`,
/// `hlt`. Exact: no interrupt reaches the guest (IF is clear and the VM
/// has no interrupt controller), so it runs nothing else; `hlt`, whose
/// intercept exits to the host, ends its block, a #VMEXIT for a host
/// interrupt happens between blocks, and a block a nested page fault cuts
/// short counts only what ran (the plugin counts retired instructions,
/// tests/insns_exact.rs).
const GUEST_INSNS: u64 = 2 * GUEST_ITERATIONS + 2;

/// The exits loop: `out` to port 0xe9 and `cpuid`, each this many times.
const EXIT_ITERATIONS: u64 = 1_000;

/// The host loop's own instructions.
const HOST_LOOP_INSNS: u64 = 2 * HOST_ITERATIONS;

/// What the host's window holds at user addresses besides the loop: the
/// line protocol's side of `levels` (the return from the `write(2)` of
/// `host-begin`, the `read(2)` of `go` and its check, the `write(2)` of
/// `host-end`, the start of the next `read(2)`: no stdio, a few hundred
/// instructions of a static binary, 221 to 247 measured), and nothing
/// else: the host's only other process, /init's shell, waits for `levels`.
const HOST_USER_SLACK: u64 = 1_000;

/// What the guest's window may hold at level-1 user addresses: `levels`
/// in `KVM_RUN` and back (KVM handles a #VMEXIT for a host interrupt in
/// the kernel; only the HLT returns to user space) and the protocol's
/// lines (230 to 260 measured). Far below either loop: neither loop is
/// counted in the host's user space there.
const GUEST_HOST_USER_SLACK: u64 = 1_000;

/// The whole boot's limit: boot, the two loops and power-off take about
/// 20 s on an idle 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(300);

/// One vCPU under `-icount` (as `blklab run --accel nested
/// --deterministic` runs the host): QEMU restarts translation blocks
/// there, some without the plugin's callbacks, so the VMRUN tracking may
/// lose transitions; the levels by address stay exact.
#[test]
fn one_vcpu_under_icount_a_guest_loop_counts_at_level_2_and_a_host_loop_at_level_1() {
    levels(Machine::ICOUNT);
}

/// Two vCPUs, one TCG thread each (how `blklab run --accel nested` boots
/// the host by default): the host's scheduler may move `levels`, and with
/// it the KVM vCPU, between them; each vCPU's level is its own. Without
/// `-icount` the VMRUN tracking agrees with the address block for block.
#[test]
fn two_vcpus_a_guest_loop_counts_at_level_2_and_a_host_loop_at_level_1() {
    levels(Machine::TWO_VCPUS);
}

/// Boot the host on `machine`, run `levels` in it, and check both windows:
/// the guest's loop counts at level 2, exactly, and not in the host's user
/// space; the host's loop counts at level 1 user, and nothing at level 2.
fn levels(machine: Machine) {
    let program = Program {
        source: "levels.c",
        defines: &[
            ("GUEST_ITERATIONS", GUEST_ITERATIONS),
            ("HOST_ITERATIONS", HOST_ITERATIONS),
            ("EXIT_ITERATIONS", EXIT_ITERATIONS),
        ],
        timeout: TIMEOUT,
    };
    let (dumps, _console) = run(machine, &program);
    assert_eq!(
        dumps.step_names(),
        [
            "guest-begin",
            "guest-end",
            "host-begin",
            "host-end",
            "exits-begin",
            "exits-end"
        ]
    );

    let guest = dumps.window("guest-begin", "guest-end");
    eprintln!("{machine:?}: guest window: {}", summary(&guest));
    // Real mode at 0000:1000: a user address by the plugin's rule (below
    // 0xffff800000000000).
    assert_eq!(
        guest.level2.kernel(),
        0,
        "guest window: {}",
        summary(&guest)
    );
    assert_eq!(
        guest.level2.user(),
        GUEST_INSNS,
        "guest window: level 2 is the guest's {GUEST_INSNS} instructions: {}",
        summary(&guest)
    );
    assert!(guest.vmruns() >= 1, "{}", summary(&guest));
    assert_eq!(guest.rule, LevelRule::Address);
    assert!(
        machine.icount() || guest.levels_consistent(),
        "{}",
        summary(&guest)
    );
    assert!(
        guest.level1.user() <= GUEST_HOST_USER_SLACK,
        "guest window: the guest's loop counted in the host's user space: {}",
        summary(&guest)
    );

    let host = dumps.window("host-begin", "host-end");
    eprintln!("{machine:?}: host window: {}", summary(&host));
    assert_eq!(
        host.level2.kernel() + host.level2.user(),
        0,
        "host window: the host's loop counted as guest: {}",
        summary(&host)
    );
    assert_eq!(host.vmruns(), 0, "{}", summary(&host));
    assert!(
        machine.icount() || host.levels_consistent(),
        "{}",
        summary(&host)
    );
    let user = host.level1.user();
    assert!(
        (HOST_LOOP_INSNS..=HOST_LOOP_INSNS + HOST_USER_SLACK).contains(&user),
        "host window: level 1 user {user}, want the loop's {HOST_LOOP_INSNS} + at most {HOST_USER_SLACK}: {}",
        summary(&host)
    );
    exits(&dumps);
    // From the first window on, as a dump's self-check says. Not from
    // power-on: the firmware (SeaBIOS relocates its init code to the top
    // of RAM, in node 1) counts at level 2 by address, some 400 000
    // instructions before the kernel starts, which the VMRUN tracking
    // counts at level 1.
    let after_boot = dumps.window("guest-begin", "host-end");
    assert!(
        machine.icount() || after_boot.levels_consistent(),
        "{}",
        summary(&after_boot)
    );
}

/// The would-be exits, exactly: the guest's one HLT at level 2 and nothing
/// else there; the host program's `out` to port 0xe9 and `cpuid`, each
/// [`EXIT_ITERATIONS`] times, at level 1 (no other code uses that port or,
/// in so short a window, CPUID), none at level 2.
fn exits(dumps: &Dumps) {
    let guest = dumps.window("guest-begin", "guest-end");
    assert_eq!(guest.exits_unavailable, None);
    let l2: Vec<(ExitKind, u64)> = guest
        .level2
        .exits
        .counts
        .iter()
        .map(|((_, k), n)| (*k, *n))
        .collect();
    assert_eq!(l2, [(ExitKind::Hlt, 1)], "guest window, level 2");
    let io = dumps.window("exits-begin", "exits-end");
    let l1 = &io.level1.exits;
    assert_eq!(l1.of(ExitKind::Out(0xe9)), EXIT_ITERATIONS, "{l1:?}");
    assert_eq!(l1.of(ExitKind::Cpuid), EXIT_ITERATIONS, "{l1:?}");
    assert_eq!(l1.of(ExitKind::In(0xe9)), 0, "{l1:?}");
    assert!(io.level2.exits.counts.is_empty(), "{:?}", io.level2.exits);
    // Outside the loop's window the port is not used.
    let host = dumps.window("host-begin", "host-end");
    assert_eq!(host.level1.exits.of(ExitKind::Out(0xe9)), 0);
}
