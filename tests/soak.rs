//! Soak: one `blklab serve` daemon under mixed verified IO from libblkio
//! (4 queues × depth 128, reads and writes of random 4 KiB blocks, fault
//! injection on), with the client disconnecting and reconnecting every few
//! seconds — half the time with requests still in flight. Afterwards every
//! block whose write completed reads back with that write's data, a block
//! whose write was in flight at a disconnect holds either its old or its new
//! data (never anything else), and the daemon's RSS and open fds are what
//! they were after the first connection.
//!
//! Short in CI (`BLKLAB_SOAK_SECS`, default 12 s per disk kind); a long run
//! by hand:
//!
//! ```sh
//! BLKLAB_SOAK_SECS=1800 cargo test --release --test soak -- --nocapture
//! ```
//!
//! prints duration, IOs, reconnects, and RSS and fd count at start and end
//! (recorded in docs/tests.md).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::client::{Client, Op};
use common::Daemon;
use rand::{Rng, SeedableRng};

const QUEUES: usize = 4;
const DEPTH: usize = 128;
const BLOCK: u64 = 4096;
const DISK: u64 = 64 << 20;
/// Every 97th request of each queue fails with IOERR (a prime, so it walks
/// over reads and writes).
const FAIL_EVERY: &str = "97";

/// What a block may hold: the fill byte of its last completed write (0 for
/// never written), plus the fill of a write that was in flight when the
/// client went away (which may or may not have landed).
#[derive(Clone, Copy, Debug)]
struct Expect {
    done: u8,
    maybe: Option<u8>,
}

impl Expect {
    fn allows(&self, got: u8) -> bool {
        got == self.done || self.maybe == Some(got)
    }
}

fn proc_status(pid: i32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn soak_secs() -> u64 {
    std::env::var("BLKLAB_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
}

/// Totals of one soak.
#[derive(Default, Debug)]
struct Totals {
    ios: u64,
    failed: u64,
    reconnects: u64,
    abandoned: u64,
}

/// One connection's worth of work on every queue: `rounds` verified batches
/// of DEPTH requests, then (if `abandon`) one batch of writes submitted and
/// left in flight when the client is dropped.
fn session(
    client: &mut Client,
    expect: &mut [HashMap<u64, Expect>],
    rng_seed: u64,
    rounds: usize,
    abandon: bool,
) -> (u64, u64, u64) {
    let region = DISK / QUEUES as u64 / BLOCK;
    let results = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (qi, (q, exp)) in client.queues.iter_mut().zip(expect.iter_mut()).enumerate() {
            hs.push(s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(rng_seed * 31 + qi as u64);
                let base = qi as u64 * region;
                let (mut ios, mut failed) = (0u64, 0u64);
                for _ in 0..rounds {
                    // DEPTH distinct blocks: no two requests of a batch overlap.
                    let mut picks = std::collections::BTreeSet::new();
                    while picks.len() < DEPTH {
                        picks.insert(base + rng.gen_range(0..region));
                    }
                    let reqs: Vec<(Op, u64)> = picks
                        .iter()
                        .map(|b| {
                            if rng.gen_bool(0.5) {
                                (Op::Write(rng.gen_range(1..=255u8)), b * BLOCK)
                            } else {
                                (Op::Read, b * BLOCK)
                            }
                        })
                        .collect();
                    for ((ret, data), (op, off)) in q.batch(&reqs, BLOCK as usize).iter().zip(&reqs)
                    {
                        ios += 1;
                        let b = off / BLOCK;
                        let e = exp.entry(b).or_insert(Expect {
                            done: 0,
                            maybe: None,
                        });
                        if *ret != 0 {
                            // Injected IOERR: the request did not run.
                            assert_eq!(*ret, -libc::EIO, "queue {qi} block {b}: {ret}");
                            failed += 1;
                            continue;
                        }
                        match op {
                            Op::Write(fill) => {
                                *e = Expect {
                                    done: *fill,
                                    maybe: None,
                                }
                            }
                            Op::Read => {
                                let got = data[0];
                                assert!(
                                    data.iter().all(|x| *x == got),
                                    "queue {qi} block {b}: torn block"
                                );
                                assert!(
                                    e.allows(got),
                                    "queue {qi} block {b}: read {got}, expected {e:?}"
                                );
                                // What was read is what the block holds now.
                                *e = Expect {
                                    done: got,
                                    maybe: None,
                                };
                            }
                        }
                    }
                }
                let mut abandoned = 0;
                if abandon {
                    // Submit writes and go away without waiting for them.
                    for i in 0..DEPTH / 2 {
                        let b = base + rng.gen_range(0..region);
                        if exp.get(&b).is_some_and(|e| e.maybe.is_some()) {
                            continue;
                        }
                        let fill = rng.gen_range(1..=255u8);
                        let p = i * BLOCK as usize;
                        q.buf()[p..p + BLOCK as usize].fill(fill);
                        let ptr = q.ptr(p, BLOCK as usize);
                        q.q.write(b * BLOCK, ptr, BLOCK as usize, i, blkio::ReqFlags::empty());
                        let e = exp.entry(b).or_insert(Expect {
                            done: 0,
                            maybe: None,
                        });
                        e.maybe = Some(fill);
                        abandoned += 1;
                    }
                }
                (ios, failed, abandoned)
            }));
        }
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    results
        .into_iter()
        .fold((0, 0, 0), |a, r| (a.0 + r.0, a.1 + r.1, a.2 + r.2))
}

fn soak(disk_args: &[&str], what: &str) {
    let mut args = disk_args.to_vec();
    args.extend([
        "--size",
        "64M",
        "--num-queues",
        "4",
        "--queue-size",
        "128",
        "--fail-every",
        FAIL_EVERY,
    ]);
    let mut d = Daemon::spawn(&args, 1);
    let pid = d.pid();
    let secs = soak_secs();
    let mut expect: Vec<HashMap<u64, Expect>> = vec![HashMap::new(); QUEUES];
    let mut t = Totals::default();

    // Warm up one connection, then take the baseline.
    {
        let mut c = Client::connect(&d.socket, QUEUES).expect("connect");
        let (ios, failed, _) = session(&mut c, &mut expect, 0, 4, false);
        t.ios += ios;
        t.failed += failed;
    }
    common::wait_until("the first connection to close", || fds_settled(pid));
    let rss0 = proc_status(pid, "VmRSS:");
    let fds0 = fds(pid);
    let start = Instant::now();
    let mut seed = 1;
    while start.elapsed() < Duration::from_secs(secs) {
        let mut c = Client::connect(&d.socket, QUEUES).expect("reconnect");
        t.reconnects += 1;
        // A few seconds of IO per connection (fewer rounds on a slow box is fine).
        let abandon = seed % 2 == 0;
        let (ios, failed, abandoned) = session(&mut c, &mut expect, seed, 6, abandon);
        t.ios += ios;
        t.failed += failed;
        t.abandoned += abandoned;
        drop(c);
        seed += 1;
        assert!(d.alive(), "{what}: the daemon died");
    }
    // Every block: its last completed write, or an abandoned one.
    let mut c = Client::connect(&d.socket, QUEUES).expect("final connect");
    let mut checked = 0;
    for (qi, exp) in expect.iter().enumerate() {
        let q = &mut c.queues[qi];
        let blocks: Vec<(&u64, &Expect)> = exp.iter().collect();
        for chunk in blocks.chunks(DEPTH) {
            let reqs: Vec<(Op, u64)> = chunk.iter().map(|(b, _)| (Op::Read, **b * BLOCK)).collect();
            // Injected failures hit the final reads too: retry those.
            let mut pending: Vec<usize> = (0..reqs.len()).collect();
            while !pending.is_empty() {
                let now: Vec<(Op, u64)> = pending.iter().map(|i| reqs[*i]).collect();
                let res = q.batch(&now, BLOCK as usize);
                let mut again = Vec::new();
                for (k, (ret, data)) in res.into_iter().enumerate() {
                    let i = pending[k];
                    if ret != 0 {
                        again.push(i);
                        continue;
                    }
                    let (b, e) = chunk[i];
                    assert!(
                        data.iter().all(|x| *x == data[0]) && e.allows(data[0]),
                        "{what}: block {b} holds {} after the soak, expected {e:?}",
                        data[0]
                    );
                    checked += 1;
                }
                pending = again;
            }
        }
    }
    drop(c);
    common::wait_until("the last connection to close", || fds_settled(pid));
    let rss1 = proc_status(pid, "VmRSS:");
    let fds1 = fds(pid);
    eprintln!(
        "soak {what}: {:.0} s, {} IOs ({} injected IOERR), {} reconnects, {} writes abandoned in flight, {checked} blocks verified; RSS {rss0} kB -> {rss1} kB, fds {fds0} -> {fds1}",
        start.elapsed().as_secs_f64(),
        t.ios,
        t.failed,
        t.reconnects,
        t.abandoned
    );
    assert!(
        t.reconnects >= 2,
        "{what}: only {} reconnects",
        t.reconnects
    );
    assert!(t.failed > 0, "{what}: fault injection never hit");
    assert_eq!(fds1, fds0, "{what}: fds leaked");
    // Memory: the mem disk's pages are touched during the soak, so allow
    // them, plus slack for allocator noise; a leak per connection or per
    // request would exceed it over a long run.
    let disk_kb = if what == "mem" { DISK / 1024 } else { 0 };
    assert!(
        rss1 <= rss0 + disk_kb + 16 * 1024,
        "{what}: RSS grew from {rss0} kB to {rss1} kB"
    );
    let status = d.terminate();
    assert!(status.success(), "{what}: daemon exit {status}");
}

/// No connection's fds remain (the daemon's own fds are steady): two reads
/// of the fd count agree.
fn fds_settled(pid: i32) -> bool {
    let a = fds(pid);
    std::thread::sleep(Duration::from_millis(200));
    a == fds(pid)
}

#[test]
fn soak_mem_disk_with_reconnects_and_faults() {
    soak(&["--disk", "mem"], "mem");
}

#[test]
fn soak_file_disk_with_reconnects_and_faults() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("soak.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(DISK).unwrap();
    let disk = format!("file:{}", img.display());
    soak(&["--disk", &disk], "file");
}
