//! `blklab bench`: a load generator for any vhost-user-blk socket, on
//! libblkio's virtio-blk-vhost-user driver (the `blkio` crate).
//!
//! One client thread per queue keeps `depth` requests in flight (a sliding
//! window: each completion is replaced at once by a new request at a fresh
//! random offset). After an unmeasured warm-up it counts completions,
//! errors and per-request latency (submit to completion as the client sees
//! it) for `time`, and, given the backend's PID, the backend's CPU seconds
//! over the same interval from `/proc/PID/stat`.
//!
//! [`options`] turns the command line into a [`mode::BenchMode`] (one
//! load, the comparison, the instruction count), which [`mode`] runs.
//! [`versus_qsd`] runs identical loads against qemu-storage-daemon and
//! `blklab serve` in one run and prints their ratios. [`client`] is the
//! libblkio connection and [`daemon`] the backend spawner; the tests and
//! benches (`tests/common`) use both. Both comparisons end in [`Verdict`]s
//! (and the targets they could not judge, [`Skipped`]);
//! every failure is a [`BenchError`] kind.

pub(crate) mod callgrind;
pub mod client;
pub mod daemon;
mod error;
pub mod idle;
pub mod instructions;
pub mod mode;
pub mod options;
pub(crate) mod reference_qsd;
pub(crate) mod verdict;
pub mod versus_qsd;

use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use blkio::{Completion, ReqFlags};
use serde::Serialize;

use crate::stats::histogram::{Hist, HistSummary};
use client::{Connected, Connection, Queue, QueueSetup};
pub(crate) use error::blkio_err;
pub use error::BenchError;
pub(crate) use verdict::{Skipped, Verdict};

/// What the requests do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RwMode {
    Randread,
    Randwrite,
    /// Half reads, half writes, chosen at random per request.
    Randrw,
}

impl std::fmt::Display for RwMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RwMode::Randread => "randread",
            RwMode::Randwrite => "randwrite",
            RwMode::Randrw => "randrw",
        })
    }
}

/// What a load asks of a device: how many queues, how deep, what size and
/// kind of request, how long.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LoadShape {
    pub queues: usize,
    /// Requests kept in flight per queue.
    pub depth: usize,
    /// Bytes per request.
    pub bs: usize,
    pub rw: RwMode,
    /// Measured interval.
    pub time: Duration,
    /// Unmeasured interval before it.
    pub warmup: Duration,
}

/// One load: where, its shape, and how it is driven and measured.
#[derive(Debug, Clone, Serialize)]
pub struct Load {
    pub socket: PathBuf,
    #[serde(flatten)]
    pub shape: LoadShape,
    /// Use libblkio poll queues: the client busy-waits for completions
    /// instead of sleeping on its completion eventfd.
    pub client_poll: bool,
    /// The backend process whose CPU time to measure.
    pub backend_pid: Option<i32>,
    /// Seed of the offset/op stream (each queue derives its own).
    pub seed: u64,
    /// A counted load: each queue issues exactly this many requests and
    /// the load ends when they have completed (`time` and `warmup` are
    /// then ignored; every request is measured). For instruction counts,
    /// where two loads must differ by a known number of requests.
    pub count: Option<u64>,
    /// Pause between a completion and the request replacing it (a counted
    /// QD1 load with a pause long enough for the backend to go back to
    /// sleep measures one wake-up per request).
    pub think: Duration,
    /// Pin the client's queue threads to these CPUs (`None`: anywhere).
    pub client_cpus: Option<Vec<usize>>,
}

impl Load {
    pub fn new(socket: &Path) -> Load {
        Load {
            socket: socket.to_path_buf(),
            shape: LoadShape {
                queues: 1,
                depth: 64,
                bs: 4096,
                rw: RwMode::Randread,
                time: Duration::from_secs(10),
                warmup: Duration::from_millis(500),
            },
            client_poll: false,
            backend_pid: None,
            seed: 1,
            count: None,
            think: Duration::ZERO,
            client_cpus: None,
        }
    }

    /// A short description: `randread 4k q1 qd64`.
    pub(crate) fn describe(&self) -> String {
        let shape = &self.shape;
        format!(
            "{} {} q{} qd{}{}",
            shape.rw,
            crate::util::units::format_size(shape.bs as u64).to_lowercase(),
            shape.queues,
            shape.depth,
            if self.client_poll { " poll-client" } else { "" }
        )
    }
}

/// What one load measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub load: String,
    /// Requests completed in the measured interval.
    pub requests: u64,
    /// Of `requests`, the reads and the writes (`reads + writes ==
    /// requests`).
    pub reads: u64,
    pub writes: u64,
    /// Completions with a non-zero result.
    pub errors: u64,
    pub seconds: f64,
    pub iops: f64,
    pub bytes_per_s: f64,
    /// Submit → completion as the client sees it, ns.
    pub latency_ns: HistSummary,
    /// The backend's CPU seconds (user + system) over the measured interval.
    pub backend_cpu_s: Option<f64>,
    /// Requests per backend CPU-second.
    pub iops_per_backend_cpu_s: Option<f64>,
    /// This process's CPU seconds over the measured interval (the client).
    pub client_cpu_s: f64,
}

impl BenchReport {
    /// Human-readable lines.
    pub fn text(&self) -> String {
        let l = &self.latency_ns;
        let mut s = format!(
            "{}: {:.0} IOPS, {:.1} MiB/s, {} requests ({} reads, {} writes) in {:.2} s, {} errors\n",
            self.load,
            self.iops,
            self.bytes_per_s / (1024.0 * 1024.0),
            self.requests,
            self.reads,
            self.writes,
            self.seconds,
            self.errors
        );
        s += &format!(
            "latency (us): mean {:.1}, p50 {:.1}, p90 {:.1}, p99 {:.1}, p99.9 {:.1}, max {:.1}\n",
            l.mean / 1e3,
            l.p50 as f64 / 1e3,
            l.p90 as f64 / 1e3,
            l.p99 as f64 / 1e3,
            l.p999 as f64 / 1e3,
            l.max as f64 / 1e3
        );
        if let (Some(c), Some(per)) = (self.backend_cpu_s, self.iops_per_backend_cpu_s) {
            s += &format!(
                "backend CPU: {c:.3} s ({:.1}% of one CPU), {per:.0} requests per backend CPU-second ({:.2} us per request)\n",
                100.0 * c / self.seconds,
                1e6 / per
            );
        }
        s += &format!(
            "client CPU: {:.3} s ({:.1}% of one CPU)\n",
            self.client_cpu_s,
            100.0 * self.client_cpu_s / self.seconds
        );
        s
    }
}

/// CPU seconds (user + system) of process `pid` so far, from
/// `/proc/PID/stat` (clock-tick resolution; includes exited threads).
pub(crate) fn process_cpu_s(pid: i32) -> Option<f64> {
    crate::util::procfs::process(pid).map(|s| s.cpu_s())
}

/// What `BIN --version` printed, or why it could not run (`hint`: how to
/// install it).
pub(crate) fn version_output(bin: &Path, hint: &'static str) -> Result<Output, BenchError> {
    Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|source| BenchError::VersionRun {
            bin: bin.to_path_buf(),
            hint,
            source,
        })
}

/// CPU seconds of this process (every thread), from getrusage.
fn self_cpu_s() -> f64 {
    let mut ru = MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the rusage we pass; RUSAGE_SELF is valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return 0.0;
    }
    // SAFETY: initialised by the successful call above.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A small, fast PRNG for offsets (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// What one client thread counted.
struct QueueResult {
    requests: u64,
    reads: u64,
    writes: u64,
    errors: u64,
    bytes: u64,
    latency: Hist,
}

/// Shared phase boundaries of a run.
#[derive(Clone, Copy)]
struct Phases {
    measure_from: Instant,
    end: Instant,
}

/// CPU time at one instant: the backend's (when measured) and this
/// process's.
#[derive(Clone, Copy)]
struct CpuSample {
    backend_s: Option<f64>,
    client_s: f64,
    at: Instant,
}

impl CpuSample {
    fn now(backend_pid: Option<i32>) -> CpuSample {
        CpuSample {
            backend_s: backend_pid.and_then(process_cpu_s),
            client_s: self_cpu_s(),
            at: Instant::now(),
        }
    }
}

/// Sleep until `t` (at once if it has passed).
fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Run one load and report it.
pub fn run(load: &Load) -> Result<BenchReport, BenchError> {
    check_shape(&load.shape)?;
    let (conn, blocks) = open(load)?;
    let phases = phases(load)?;
    let (results, before, after) = drive(conn, load, blocks, phases)?;
    summarise(load, &results, before, after)
}

fn check_shape(shape: &LoadShape) -> Result<(), BenchError> {
    if shape.queues == 0 || shape.depth == 0 || shape.bs == 0 || shape.bs % 512 != 0 {
        return Err(BenchError::BadShape {
            queues: shape.queues,
            depth: shape.depth,
            bs: shape.bs,
        });
    }
    Ok(())
}

/// Connect, start the queues with room for `depth` requests each, and
/// size the disk: the connection and the disk's length in requests.
fn open(load: &Load) -> Result<(Connection, u64), BenchError> {
    let shape = &load.shape;
    let connected = Connected::connect(&load.socket, false)?;
    let max_qs = connected
        .blkio()
        .get_i32("max-queue-size")
        .unwrap_or(256)
        .max(2);
    // At least 64 entries: a request takes three descriptors, and a ring
    // too small for one without indirect descriptors hangs some backends
    // (qemu-storage-daemon never completes on a 2-entry ring).
    let queue_size = (shape.depth.next_power_of_two().max(64) as i32).min(max_qs);
    if (queue_size as usize) < shape.depth {
        return Err(BenchError::DepthOverQueueSize {
            depth: shape.depth,
            max: max_qs,
        });
    }
    // Each queue's buffers: `depth` slots of `bs` bytes.
    let conn = connected.start(QueueSetup {
        queues: shape.queues,
        queue_size,
        poll: load.client_poll,
        buf_per_queue: shape.depth * shape.bs,
    })?;
    let capacity = conn
        .blkio
        .get_u64("capacity")
        .map_err(blkio_err("capacity"))?;
    let bs = shape.bs as u64;
    let blocks = capacity / bs;
    if blocks == 0 {
        return Err(BenchError::DiskTooSmall { capacity, bs });
    }
    Ok((conn, blocks))
}

/// When the load measures and ends: after the warm-up for `time`, or for a
/// counted load from the start until the last request completes.
fn phases(load: &Load) -> Result<Phases, BenchError> {
    if load.count == Some(0) {
        return Err(BenchError::NoRequests);
    }
    let start = Instant::now() + Duration::from_millis(20);
    Ok(match load.count {
        // Counted: measured from the start; the end is when the last
        // request completes (a day is only an upper bound).
        Some(_) => Phases {
            measure_from: start,
            end: start + Duration::from_secs(86_400),
        },
        None => Phases {
            measure_from: start + load.shape.warmup,
            end: start + load.shape.warmup + load.shape.time,
        },
    })
}

/// One client thread per queue, CPU sampled at the start and the end of
/// the measured interval: what each queue counted, and the two samples.
fn drive(
    conn: Connection,
    load: &Load,
    blocks: u64,
    phases: Phases,
) -> Result<(Vec<QueueResult>, CpuSample, CpuSample), BenchError> {
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, q) in conn.queues.into_iter().enumerate() {
            let seed = load.seed.wrapping_mul(1000).wrapping_add(i as u64);
            let h = std::thread::Builder::new()
                .name(format!("bench-q{i}"))
                .spawn_scoped(s, move || queue_loop(q, load, blocks, seed, phases))
                .map_err(BenchError::Thread)?;
            handles.push(h);
        }
        sleep_until(phases.measure_from);
        let before = CpuSample::now(load.backend_pid);
        if load.count.is_none() {
            sleep_until(phases.end);
        }
        let mut out = Vec::new();
        for (i, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(r) => out.push(r?),
                Err(_) => return Err(BenchError::Panicked(i)),
            }
        }
        Ok((out, before, CpuSample::now(load.backend_pid)))
    })
}

/// The queues' counts and the CPU samples as one report.
fn summarise(
    load: &Load,
    results: &[QueueResult],
    before: CpuSample,
    after: CpuSample,
) -> Result<BenchReport, BenchError> {
    let mut latency = Hist::new_latency();
    let (mut requests, mut reads, mut writes, mut errors, mut bytes) = (0, 0, 0, 0, 0);
    for r in results {
        latency.merge(&r.latency);
        requests += r.requests;
        reads += r.reads;
        writes += r.writes;
        errors += r.errors;
        bytes += r.bytes;
    }
    let seconds = match load.count {
        Some(_) => after.at.saturating_duration_since(before.at).as_secs_f64(),
        None => load.shape.time.as_secs_f64(),
    };
    let backend_cpu_s = match (before.backend_s, after.backend_s) {
        (Some(a), Some(b)) => Some((b - a).max(0.0)),
        (None, _) if load.backend_pid.is_some() => {
            return Err(BenchError::ProcStat {
                pid: load.backend_pid.unwrap_or(0),
            })
        }
        _ => None,
    };
    let iops = requests as f64 / seconds;
    Ok(BenchReport {
        load: load.describe(),
        requests,
        reads,
        writes,
        errors,
        seconds,
        iops,
        bytes_per_s: bytes as f64 / seconds,
        latency_ns: latency.summary(),
        backend_cpu_s,
        iops_per_backend_cpu_s: backend_cpu_s
            .filter(|c| *c > 0.0)
            .map(|c| requests as f64 / c),
        client_cpu_s: (after.client_s - before.client_s).max(0.0),
    })
}

/// One queue's closed loop: keep `depth` requests in flight until the end,
/// then collect the stragglers.
fn queue_loop(
    queue: Queue,
    load: &Load,
    blocks: u64,
    seed: u64,
    phases: Phases,
) -> Result<QueueResult, BenchError> {
    if let Some(cpus) = &load.client_cpus {
        crate::util::affinity::pin_current_thread(cpus).map_err(BenchError::Pin)?;
    }
    let mut client = QueueClient {
        queue,
        load,
        blocks,
        rng: Rng(seed),
        issued_at: vec![phases.measure_from; load.shape.depth],
        writing: vec![false; load.shape.depth],
        counted: QueueResult {
            requests: 0,
            reads: 0,
            writes: 0,
            errors: 0,
            bytes: 0,
            latency: Hist::new_latency(),
        },
    };
    // Wait for the start line so every queue begins together.
    let warmup = if load.count.is_some() {
        Duration::ZERO
    } else {
        load.shape.warmup
    };
    sleep_until(
        phases
            .measure_from
            .checked_sub(warmup)
            .unwrap_or(phases.measure_from),
    );
    let first_batch = load.count.map_or(load.shape.depth, |n| {
        load.shape
            .depth
            .min(usize::try_from(n).unwrap_or(usize::MAX))
    });
    let now = Instant::now();
    for slot in 0..first_batch {
        client.submit(slot, now);
    }
    client.complete_all(first_batch, phases)?;
    Ok(client.counted)
}

/// One queue's client: its slots (one request in flight each), the offset
/// and op stream, and what it has counted.
struct QueueClient<'a> {
    queue: Queue,
    load: &'a Load,
    /// The disk's length in requests.
    blocks: u64,
    rng: Rng,
    /// When each slot's request was submitted.
    issued_at: Vec<Instant>,
    /// Whether each slot's request is a write.
    writing: Vec<bool>,
    counted: QueueResult,
}

impl QueueClient<'_> {
    /// Submit slot `slot`'s request (issued `at`) at a fresh random offset.
    fn submit(&mut self, slot: usize, at: Instant) {
        let bs = self.load.shape.bs;
        self.issued_at[slot] = at;
        let off = (self.rng.next() % self.blocks) * bs as u64;
        let write = match self.load.shape.rw {
            RwMode::Randread => false,
            RwMode::Randwrite => true,
            RwMode::Randrw => self.rng.next() & 1 == 1,
        };
        self.writing[slot] = write;
        // slot < depth: inside this queue's `depth * bs` bytes.
        let buf = self.queue.ptr(slot * bs, bs);
        if write {
            self.queue.q.write(off, buf, bs, slot, ReqFlags::empty());
        } else {
            self.queue.q.read(off, buf, bs, slot, ReqFlags::empty());
        }
    }

    /// Replace each completion with a new request until the end (or, for a
    /// counted load, until all are issued), then collect the stragglers.
    fn complete_all(&mut self, first_batch: usize, phases: Phases) -> Result<(), BenchError> {
        let mut comps: Vec<MaybeUninit<Completion>> = (0..self.load.shape.depth)
            .map(|_| MaybeUninit::uninit())
            .collect();
        let mut issued = first_batch as u64;
        let mut outstanding = first_batch;
        let mut ending = false;
        while outstanding > 0 {
            let mut timeout = Duration::from_secs(30);
            let got = self
                .queue
                .q
                .do_io(&mut comps, 1, Some(&mut timeout), None)
                .map_err(blkio_err("do_io"))?;
            if got == 0 {
                return Err(BenchError::Stalled {
                    in_flight: outstanding,
                });
            }
            let now = Instant::now();
            let measuring = now >= phases.measure_from && now < phases.end;
            if now >= phases.end {
                ending = true;
            }
            for c in &comps[..got] {
                // SAFETY: do_io initialised the first `got` entries.
                let c = unsafe { c.assume_init_ref() };
                self.count(c, measuring, now);
                if ending || self.load.count.is_some_and(|n| issued >= n) {
                    outstanding -= 1;
                } else {
                    if !self.load.think.is_zero() {
                        std::thread::sleep(self.load.think);
                    }
                    self.submit(c.user_data, Instant::now());
                    issued += 1;
                }
            }
        }
        Ok(())
    }

    /// Count completion `c`, seen at `now`: in full while `measuring`,
    /// else only an error.
    fn count(&mut self, c: &Completion, measuring: bool, now: Instant) {
        let res = &mut self.counted;
        if measuring {
            res.requests += 1;
            if self.writing[c.user_data] {
                res.writes += 1;
            } else {
                res.reads += 1;
            }
            res.bytes += self.load.shape.bs as u64;
            if c.ret != 0 {
                res.errors += 1;
            }
            res.latency.record(
                now.saturating_duration_since(self.issued_at[c.user_data])
                    .as_nanos() as u64,
            );
        } else if c.ret != 0 {
            // Errors count even outside the measured interval.
            res.errors += 1;
        }
    }
}
