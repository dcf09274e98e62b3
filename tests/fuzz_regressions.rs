//! Every input the fuzz targets in `fuzz/` ever crashed on, kept under
//! `tests/fixtures/fuzz/TARGET/`, and the seed corpora
//! (`fuzz/corpus/TARGET/seed-*`), replayed through the same entry points
//! the targets call (`blklab::fuzz`). A crash input that panics here again
//! is a regression; see README.md, "Fuzzing".

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use blklab::fuzz;
use vhost::vhost_user::message::VhostUserHeaderFlag;
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo};

/// The kept crash inputs and seeds of `target`, sorted.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = common::root();
    let mut files = Vec::new();
    for dir in [
        root.join("tests/fixtures/fuzz").join(target),
        root.join("fuzz/corpus").join(target),
    ] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            // The corpus directory also collects what libFuzzer found
            // locally (ignored by git); only the committed seeds count.
            if p.starts_with(root.join("fuzz")) && !name.starts_with("seed-") {
                continue;
            }
            files.push(p);
        }
    }
    files.sort();
    assert!(!files.is_empty(), "no inputs for {target}");
    files
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect()
}

fn replay(target: &str, run: impl Fn(&[u8])) {
    for (path, data) in inputs(target) {
        eprintln!("{target}: {}", path.display());
        run(&data);
    }
}

#[test]
fn request() {
    replay("request", fuzz::request);
}

#[test]
fn scenario() {
    replay("scenario", fuzz::scenario);
}

#[test]
fn config() {
    replay("config", fuzz::config);
}

/// `tests/fixtures/fuzz/config/oom-count.toml`: `count = 4000000000` built
/// four billion disk configurations (out of memory); now an error.
#[test]
fn config_count_is_bounded() {
    let p = common::root().join("tests/fixtures/fuzz/config/oom-count.toml");
    let text = std::fs::read_to_string(&p).unwrap();
    let e = blklab::device::config_file::parse_config_file(&text, &p).unwrap_err();
    assert!(
        e.to_string()
            .contains("--count must be 1..=256, got 4000000000"),
        "{e}"
    );
}

#[test]
fn vhost_user() {
    let d = fuzz::Daemon::start().unwrap();
    replay("vhost_user", |data| d.vhost_user(data));
    // For the log only: whether the kicks were served before the seeds
    // stopped their rings is up to the scheduler.
    let doc = blklab::backend::control::query_stats(d.control_socket(), "stats").unwrap();
    let served: u64 = doc.disks[0]
        .queues
        .iter()
        .map(|q| q.counters.requests)
        .sum();
    eprintln!("vhost_user: the daemon served {served} requests");
    // Still serving: one more connection after all of them.
    d.vhost_user(&[]);
}

#[test]
fn control() {
    let d = fuzz::Daemon::start().unwrap();
    replay("control", |data| d.control(data));
    d.control(b"stats\n");
}

/// The crash `vhost_user` found (kept as
/// `tests/fixtures/fuzz/vhost_user/crash-short-memfd`): a memory region
/// larger than the file sent for it was mapped as it came, and the first
/// request whose buffers lay past the file's end killed the daemon with
/// SIGBUS. The table is refused now (a failed ack, the connection ends)
/// and the daemon serves the next frontend. Deterministic, unlike the
/// replay: the old daemon acked the table.
#[test]
fn memory_region_past_the_end_of_its_file_is_refused() {
    let d = fuzz::Daemon::start().unwrap();
    let region_size = 0x10000u64;
    for (file_size, offset, ok) in [
        (0x1000, 0, false),
        (region_size, 0x1000, false),
        (region_size, 0, true),
    ] {
        let f = backing_file(file_size);
        let sock = UnixStream::connect(d.socket()).unwrap();
        sock.set_read_timeout(Some(common::PATIENCE)).unwrap();
        let mut fe = Frontend::from_stream(sock, 2);
        fe.get_features().unwrap();
        let pf = fe.get_protocol_features().unwrap();
        assert!(pf.contains(VhostUserProtocolFeatures::REPLY_ACK));
        fe.set_protocol_features(VhostUserProtocolFeatures::REPLY_ACK)
            .unwrap();
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        fe.set_owner().unwrap();
        let info = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: region_size,
            userspace_addr: 0x7f00_0000_0000,
            mmap_offset: offset,
            mmap_handle: f.as_raw_fd(),
        };
        let r = fe.set_mem_table(&[info]);
        assert_eq!(
            r.is_ok(),
            ok,
            "{file_size}-byte file at offset {offset}: {r:?}"
        );
    }
    // Still serving.
    d.vhost_user(&[]);
}

fn backing_file(size: u64) -> File {
    let f = tempfile::tempfile().unwrap();
    f.set_len(size).unwrap();
    f
}

/// Replay the kept input `name` (under `tests/fixtures/fuzz/vhost_user/`)
/// until queue 0's counters show its ring broken (whether the worker sees
/// the input's kick before its connection ends is up to the scheduler):
/// nothing may have been served, and the daemon takes the next
/// connection at once.
fn replay_until_broken(name: &str) {
    let d = fuzz::Daemon::start().unwrap();
    let path = common::root()
        .join("tests/fixtures/fuzz/vhost_user")
        .join(name);
    let data = std::fs::read(&path).unwrap();
    let counters = || {
        let doc = blklab::backend::control::query_stats(d.control_socket(), "stats").unwrap();
        doc.disks[0].queues[0].counters.clone()
    };
    let mut replays = 0;
    while counters().ring_errors == 0 && replays < 200 {
        d.vhost_user(&data);
        replays += 1;
    }
    let q0 = counters();
    assert!(q0.ring_errors >= 1, "after {replays} replays: {q0:?}");
    assert_eq!(q0.requests, 0, "{q0:?}");
    eprintln!("{name}: broken after {replays} replays");
    // Still serving, at once.
    let t = std::time::Instant::now();
    d.vhost_user(&[]);
    assert!(t.elapsed() < common::PATIENCE);
}

/// The hang `vhost_user` found before the worker hardening (kept as
/// `tests/fixtures/fuzz/vhost_user/hang-avail-ring-at-memory-end`, written
/// by `fuzz/make-seeds.py`): queue 0's avail ring starts 4 bytes before
/// the end of guest memory, its index says one request, EVENT_IDX is on,
/// the driver kicks. The old worker looped for ever on it (and the next
/// connection timed out); now the ring is broken (a ring error, nothing
/// served) and the daemon takes the next connection at once. Whether the
/// worker sees the kick before the input's connection ends is up to the
/// scheduler, so the input is replayed until the counters say it did.
#[test]
fn an_avail_ring_at_the_end_of_memory_is_broken_not_spun() {
    replay_until_broken("hang-avail-ring-at-memory-end");
}

/// Queue 0's used ring laid over its avail ring (kept as
/// `tests/fixtures/fuzz/vhost_user/hang-used-ring-over-avail-ring`,
/// written by `fuzz/make-seeds.py`): every used entry would raise the
/// avail index the worker pops against. The ring is refused as broken,
/// nothing is served, and the daemon takes the next connection at once
/// (the input's own GET_VRING_BASE is answered: the connection ends).
#[test]
fn a_used_ring_over_the_avail_ring_is_refused_not_spun() {
    replay_until_broken("hang-used-ring-over-avail-ring");
}
