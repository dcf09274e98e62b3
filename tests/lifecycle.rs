//! The backend's lifecycle under a real guest: a crash (`kill -9`) and
//! restart on the same socket, and a live migration between two QEMUs with
//! a daemon each on one image, while the guest writes with verify. Each
//! ends with fio's exit status 0, every byte written read back verified,
//! and no `is not a head` and no `I/O error` in the guest kernel's log.
//!
//! The guest: Debian's 6.12 kernel under QEMU (TCG unless
//! `BLKLAB_ACCEL=kvm`), 2 vCPUs, 512 MiB of RAM shared with the backend
//! (a memfd), one 2-queue vhost-user-blk disk whose chardev reconnects
//! after 1 s (`reconnect-ms=1000`). Its init runs
//! `images/lifecycle/lifecycle-fio`: two fio jobs (one per vCPU, so one per
//! virtqueue) of randwrite 4k at iodepth 16 with crc32c verify and
//! `verify_fatal`, each on 16 MiB of its own (8,192 writes in all), a
//! progress line every second, then fio's status, the kernel's messages
//! and what never completed.
//!
//! Why 2 × 16 MiB: the host kills the backend at a quarter, half and three
//! quarters of the writes, each time after the restarted one has completed
//! writes again, so the write phase has to outlast three restarts (QEMU
//! reconnects 1 s after a disconnect); at the emulated latency (5–50 ms,
//! iodepth 16 on each of 2 queues: at most about 1,150 writes a second)
//! 8,192 writes take 7 s or more, and under TCG on the 2-core development
//! machine about 20 s. A whole test then takes about 1 to 1.5 minutes
//! here; a guest that loses writes ends 60 s after its last completion.
//!
//! The backend is a parameter (`lifecycle/backend.rs`): `blklab serve`
//! (emulated write latency `uniform:5ms..50ms`, so completions come out
//! of order) in the tests CI runs, and the reference qemu-storage-daemon
//! 7.2 (`images/fetch-qsd.sh`) in `#[ignore]`d tests run by hand:
//!
//! ```sh
//! cargo test --test lifecycle -- --ignored --nocapture --test-threads 1
//! ```
//!
//! Every run prints a `[lifecycle] RESULT` line (fio's status, verify, the
//! writes that never completed, the kernel's error lines, the kills or the
//! migration's downtime) and, on failure, why: the problems, what the host
//! did when, the guest's kernel messages, the daemons' and QEMU's logs and
//! the console. Results: docs/results/lifecycle.md.

mod common;

#[path = "lifecycle/backend.rs"]
mod backend;
#[path = "lifecycle/guest.rs"]
mod guest;
#[path = "lifecycle/outcome.rs"]
mod outcome;
#[path = "lifecycle/watch.rs"]
mod watch;

use std::path::{Path, PathBuf};
use std::sync::mpsc::channel;
use std::sync::Mutex;
use std::time::Duration;

use backend::{Backend, Kind, Role};
use guest::{Guest, Image, Spec};
use outcome::Outcome;
use watch::Watch;

/// One guest at a time: two TCG guests on a small machine just slow each
/// other down (the migration's destination idles until it takes over).
static SERIAL: Mutex<()> = Mutex::new(());

/// Bytes each of the two fio jobs writes (see the module's comment).
const FIO_SIZE: u64 = 16 << 20;
const JOBS: u64 = 2;
/// Seconds without a completion after which the guest abandons fio.
const STALL_S: u64 = 60;
/// How many times the crash test kills the backend.
const KILLS: u64 = 3;

/// QEMU's start to fio's start: boot and init, under TCG on a busy host.
const BOOT_PATIENCE: Duration = Duration::from_secs(240);
/// How long the host waits for the guest's writes to reach a point it
/// acts at: longer than the guest's own stall time, so the guest reports
/// a stall first.
const PROGRESS_PATIENCE: Duration = Duration::from_secs(STALL_S + 60);
/// After the host's last act, how long until the guest's end line: fio's
/// rest (the verify reads too) or the guest's stall time.
const END_PATIENCE: Duration = Duration::from_secs(STALL_S + 240);
/// The end line to QEMU's exit (init powers off).
const EXIT_PATIENCE: Duration = Duration::from_secs(30);

/// A temporary directory with the raw image both jobs' regions fit in.
fn image_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("disk.img");
    let f = std::fs::File::create(&path).expect("create the image");
    f.set_len(JOBS * FIO_SIZE + (4 << 20))
        .expect("size the image");
    (dir, path)
}

fn spec<'a>(image: &'a Image, socket: &Path) -> Spec<'a> {
    Spec {
        image,
        knobs: format!(
            "blklab.fio_size={FIO_SIZE} blklab.jobs={JOBS} blklab.iodepth=16 blklab.stall={STALL_S}"
        ),
        socket: socket.to_path_buf(),
    }
}

/// Everything a run leaves for its verdict.
struct Run {
    backend: String,
    case: &'static str,
    watch: Watch,
    /// Problems of the host's side (a kill that did not happen, a refused
    /// migration), on top of the guest's.
    host_problems: Vec<String>,
    /// Each QEMU's exit status (`None`: killed) and stderr.
    qemus: Vec<(&'static str, Option<std::process::ExitStatus>, String)>,
    /// The daemons' logs.
    logs: Vec<PathBuf>,
    /// The host's facts for the result line (kills, downtime).
    facts: String,
}

impl Run {
    /// Print the result line; fail with everything known when anything
    /// went wrong.
    fn conclude(self) {
        let outcome = Outcome::parse(&self.watch.lines);
        let mut problems = self.host_problems.clone();
        problems.extend(outcome.problems());
        eprintln!(
            "[lifecycle] RESULT {} {}: {}; {}",
            self.backend,
            self.case,
            outcome.summary(),
            self.facts
        );
        if problems.is_empty() {
            return;
        }
        panic!("{}", self.failure(&outcome, &problems));
    }

    fn failure(&self, outcome: &Outcome, problems: &[String]) -> String {
        let mut s = format!("{} {} failed:\n", self.backend, self.case);
        for p in problems {
            s.push_str(&format!("  - {p}\n"));
        }
        s.push_str("--- what the host did ---\n");
        s.push_str(&self.watch.notes.join("\n"));
        s.push_str("\n--- the guest kernel's messages while fio ran ---\n");
        s.push_str(&outcome.kernel.join("\n"));
        for log in &self.logs {
            s.push_str(&format!("\n--- {} (last 30 lines) ---\n", log.display()));
            s.push_str(&backend::tail(log, 30));
        }
        for (name, status, stderr) in &self.qemus {
            s.push_str(&format!(
                "\n--- QEMU {name}: exit {status:?}, stderr ---\n{stderr}"
            ));
        }
        s.push_str("\n--- the guest's console (every QEMU) ---\n");
        s.push_str(&self.watch.lines.join("\n"));
        s
    }
}

/// Start the backend or fail the test with its log.
fn start_backend(
    kind: &Kind,
    dir: &Path,
    label: &str,
    socket: &Path,
    image: &Path,
    role: Role,
) -> Backend {
    kind.start(dir, label, socket, image, role)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// What the kills and restarts of a crash run left.
struct Kills {
    /// The daemon running at the end (none when a restart failed).
    daemon: Option<Backend>,
    problems: Vec<String>,
    /// `WRITES:IN_FLIGHT` at each kill.
    at: Vec<String>,
    logs: Vec<PathBuf>,
}

/// Kill the backend with SIGKILL [`KILLS`] times while fio writes, each
/// time at the next quarter of the writes and once the daemon before has
/// completed writes again, and start a new one on the same socket right
/// away (QEMU reconnects by itself).
fn kill_and_restart(
    kind: &Kind,
    dir: &Path,
    (socket, disk): (&Path, &Path),
    first: Backend,
    watch: &mut Watch,
) -> Kills {
    let mut out = Kills {
        daemon: Some(first),
        problems: Vec::new(),
        at: Vec::new(),
        logs: vec![dir.join("daemon-0.log")],
    };
    for k in 1..=KILLS {
        if let Err(e) = watch.kill_point(k, KILLS + 1, PROGRESS_PATIENCE) {
            let done = k - 1;
            out.problems.push(format!(
                "the backend was killed {done} time(s) of {KILLS}: {e}"
            ));
            break;
        }
        let p = watch.progress.clone().expect("a progress line");
        out.daemon.take().expect("a running daemon").kill9();
        watch.forget_progress();
        let (writes, total) = (p.writes, watch.total_writes());
        watch.note(format!(
            "kill -9 #{k} at {writes} of {total} writes, {} write(s) in flight",
            p.inflight_writes
        ));
        out.at.push(format!("{writes}:{}", p.inflight_writes));
        let label = format!("daemon-{k}");
        out.logs.push(dir.join(format!("{label}.log")));
        match kind.start(dir, &label, socket, disk, Role::Sole) {
            Ok(d) => out.daemon = Some(d),
            Err(e) => {
                out.problems.push(format!("restart #{k} failed: {e}"));
                break;
            }
        }
        watch.note(format!("{label} started on the same socket"));
    }
    out
}

/// The crash: [`kill_and_restart`] under a guest writing with verify.
fn crash_and_restart(kind: Kind) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let image = Image::prepare();
    let (dir, disk) = image_file();
    let d = dir.path();
    let socket = d.join("vd.sock");
    let first = start_backend(&kind, d, "daemon-0", &socket, &disk, Role::Sole);
    let (tx, rx) = channel();
    let mut qemu = Guest::start("guest", &spec(&image, &socket), None, d, tx);
    let mut watch = Watch::new(rx);
    watch.fio_started(BOOT_PATIENCE, &qemu.console());
    let kills = kill_and_restart(&kind, d, (&socket, &disk), first, &mut watch);
    watch.until(END_PATIENCE, |w| w.ended.is_some());
    let (status, stderr) = qemu.finish(EXIT_PATIENCE);
    drop(kills.daemon);
    Run {
        backend: kind.name(),
        case: "kill -9 and restart",
        watch,
        host_problems: kills.problems,
        qemus: vec![("guest", status, stderr)],
        logs: kills.logs,
        facts: format!("kills (writes done:in flight) {}", kills.at.join(" ")),
    }
    .conclude();
}

/// Migrate `src` to the destination listening at `uri` while the guest
/// writes; the final `query-migrate` answer, or why the migration failed.
fn migrate(src: &Guest, uri: &str, watch: &mut Watch) -> Result<serde_json::Value, String> {
    src.qmp("migrate", serde_json::json!({ "uri": uri }))?;
    watch.note(format!("migrate to {uri} started"));
    let mut last = serde_json::Value::Null;
    let mut gone = None;
    let finished = watch.until(Duration::from_secs(300), |_| {
        match src.qmp("query-migrate", serde_json::Value::Null) {
            Ok(v) => last = v,
            Err(e) => gone = Some(e),
        }
        gone.is_some()
            || matches!(
                last["status"].as_str(),
                Some("completed" | "failed" | "cancelled")
            )
    });
    if let Some(e) = gone {
        return Err(format!(
            "the source stopped answering QMP: {e}; last: {last}"
        ));
    }
    match last["status"].as_str() {
        Some("completed") => Ok(last),
        _ if finished => Err(format!("migration ended: {last}")),
        _ if watch.ended.is_some() => Err(format!(
            "the guest ended (on {:?}) before the migration did: {last}",
            watch.ended
        )),
        _ => Err(format!("migration not finished after 300 s: {last}")),
    }
}

/// Migrate `src` to `uri` once a third of the writes are done, then stop
/// the source; the problems (none when the migration completed) and the
/// result line's facts (the downtime).
fn migrate_at_a_third(src: &Guest, uri: &str, watch: &mut Watch) -> (Vec<String>, String) {
    let mut host_problems = Vec::new();
    let mut facts = String::from("no migration");
    match watch.kill_point(1, 3, PROGRESS_PATIENCE) {
        Err(e) => host_problems.push(format!("no migration: {e}")),
        Ok(()) => match migrate(src, uri, watch) {
            Ok(m) => {
                facts = format!(
                    "migration downtime {} ms, total {} ms",
                    m["downtime"], m["total-time"]
                );
                watch.note(format!("migration completed: {facts}"));
                let _ = src.qmp("quit", serde_json::Value::Null);
            }
            Err(e) => {
                watch.note(format!("migration failed: {e}"));
                host_problems.push(format!("the migration failed: {e}"));
            }
        },
    }
    (host_problems, facts)
}

/// The live migration: a source QEMU and a destination QEMU (`-incoming`)
/// on this host, each with its own daemon and socket, both daemons on one
/// image; migrated over a Unix socket once a third of the writes are done.
fn live_migration(kind: Kind) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let image = Image::prepare();
    let (dir, disk) = image_file();
    let d = dir.path();
    let (sock_a, sock_b) = (d.join("source.sock"), d.join("destination.sock"));
    let src_daemon = start_backend(
        &kind,
        d,
        "source-daemon",
        &sock_a,
        &disk,
        Role::MigrationSource,
    );
    let dst_daemon = kind
        .start(
            d,
            "destination-daemon",
            &sock_b,
            &disk,
            Role::MigrationDestination,
        )
        .unwrap_or_else(|e| {
            panic!("the destination's daemon, on the image the source's daemon serves: {e}")
        });
    let uri = format!("unix:{}", d.join("migration.sock").display());
    let (tx, rx) = channel();
    let mut src = Guest::start("source", &spec(&image, &sock_a), None, d, tx.clone());
    let mut dst = Guest::start("destination", &spec(&image, &sock_b), Some(&uri), d, tx);
    let mut watch = Watch::new(rx);
    watch.fio_started(BOOT_PATIENCE, &src.console());
    let (mut host_problems, facts) = migrate_at_a_third(&src, &uri, &mut watch);
    watch.until(END_PATIENCE, |w| w.ended.is_some());
    if host_problems.is_empty() && watch.ended != Some("destination") {
        host_problems.push(format!(
            "the guest's end line came from {:?}, not the destination",
            watch.ended
        ));
    }
    let src_end = src.finish(EXIT_PATIENCE);
    // The destination powers off once the guest has ended there; one that
    // never took over waits for its migration forever.
    let dst_end = dst.finish(if watch.ended == Some("destination") {
        EXIT_PATIENCE
    } else {
        Duration::ZERO
    });
    drop((src_daemon, dst_daemon));
    Run {
        backend: kind.name(),
        case: "live migration",
        watch,
        host_problems,
        qemus: vec![
            ("source", src_end.0, src_end.1),
            ("destination", dst_end.0, dst_end.1),
        ],
        logs: vec![
            d.join("source-daemon.log"),
            d.join("destination-daemon.log"),
        ],
        facts,
    }
    .conclude();
}

/// `blklab serve` killed with SIGKILL three times under out-of-order
/// completions and restarted on its socket: nothing lost, nothing twice.
#[test]
fn blklab_kill9_and_restart_loses_nothing() {
    crash_and_restart(Kind::Blklab);
}

/// A live migration between two QEMUs, a `blklab serve` each, on one
/// image: the guest goes on on the destination and fio verifies.
#[test]
fn blklab_live_migration_between_two_daemons_on_one_image() {
    live_migration(Kind::Blklab);
}

/// The reference: qemu-storage-daemon 7.2, the same crash (by hand).
#[test]
#[ignore = "the reference daemon, run by hand (docs/results/lifecycle.md)"]
fn qsd_7_2_kill9_and_restart() {
    crash_and_restart(Kind::reference_qsd());
}

/// The reference: qemu-storage-daemon 7.2, the same migration (by hand).
#[test]
#[ignore = "the reference daemon, run by hand (docs/results/lifecycle.md)"]
fn qsd_7_2_live_migration() {
    live_migration(Kind::reference_qsd());
}
