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
//! [`versus_qsd`] runs identical loads against qemu-storage-daemon and
//! `blklab serve` in one run and prints their ratios. [`client`] is the
//! libblkio connection and [`daemon`] the backend spawner; the tests and
//! benches (`tests/common`) use both.

pub mod callgrind;
pub mod client;
pub mod daemon;
pub mod instructions;
pub mod reference_qsd;
pub mod versus_qsd;

use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blkio::{Completion, ReqFlags};
use serde::Serialize;
use thiserror::Error;

use crate::stats::histogram::{Hist, HistSummary};
use client::{Connected, Queue, QueueSetup};

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("libblkio: {what}: {msg}")]
    Blkio { what: &'static str, msg: String },
    #[error("invalid benchmark option: {0}")]
    Option(String),
    #[error("cannot start {name}: {source}")]
    Start {
        name: String,
        source: std::io::Error,
    },
    #[error("client thread {0} panicked")]
    Panicked(usize),
    #[error("cannot start the client thread: {0}")]
    Thread(std::io::Error),
    #[error("{0}")]
    Backend(String),
}

fn blkio_err(what: &'static str) -> impl FnOnce(blkio::Error) -> BenchError {
    move |e| BenchError::Blkio {
        what,
        msg: e.to_string(),
    }
}

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

/// One load: where, how many queues, how deep, what size and kind, how long.
#[derive(Debug, Clone, Serialize)]
pub struct Load {
    pub socket: PathBuf,
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
}

impl Load {
    pub fn new(socket: &Path) -> Load {
        Load {
            socket: socket.to_path_buf(),
            queues: 1,
            depth: 64,
            bs: 4096,
            rw: RwMode::Randread,
            time: Duration::from_secs(10),
            warmup: Duration::from_millis(500),
            client_poll: false,
            backend_pid: None,
            seed: 1,
            count: None,
            think: Duration::ZERO,
        }
    }

    /// A short description: `randread 4k q1 qd64`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} {} q{} qd{}{}",
            self.rw,
            crate::util::units::format_size(self.bs as u64).to_lowercase(),
            self.queues,
            self.depth,
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
            "{}: {:.0} IOPS, {:.1} MiB/s, {} requests in {:.2} s, {} errors\n",
            self.load,
            self.iops,
            self.bytes_per_s / (1024.0 * 1024.0),
            self.requests,
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

/// Run one load and report it.
pub fn run(load: &Load) -> Result<BenchReport, BenchError> {
    if load.queues == 0 || load.depth == 0 || load.bs == 0 || load.bs % 512 != 0 {
        return Err(BenchError::Option(format!(
            "queues and depth must be at least 1 and bs a multiple of 512 (got queues {}, depth {}, bs {})",
            load.queues, load.depth, load.bs
        )));
    }
    let connected = Connected::connect(&load.socket, false)?;
    let max_qs = connected
        .blkio()
        .get_i32("max-queue-size")
        .unwrap_or(256)
        .max(2);
    // At least 64 entries: a request takes three descriptors, and a ring
    // too small for one without indirect descriptors hangs some backends
    // (qemu-storage-daemon never completes on a 2-entry ring).
    let queue_size = (load.depth.next_power_of_two().max(64) as i32).min(max_qs);
    if (queue_size as usize) < load.depth {
        return Err(BenchError::Option(format!(
            "depth {} exceeds the device's largest queue size {max_qs}",
            load.depth
        )));
    }
    // Each queue's buffers: `depth` slots of `bs` bytes.
    let conn = connected.start(QueueSetup {
        queues: load.queues,
        queue_size,
        poll: load.client_poll,
        buf_per_queue: load.depth * load.bs,
    })?;
    let capacity = conn
        .blkio
        .get_u64("capacity")
        .map_err(blkio_err("capacity"))?;
    let bs = load.bs as u64;
    let blocks = capacity / bs;
    if blocks == 0 {
        return Err(BenchError::Option(format!(
            "the disk ({capacity} bytes) is smaller than one {bs}-byte request"
        )));
    }
    if load.count == Some(0) {
        return Err(BenchError::Option(
            "a counted load needs at least 1 request".into(),
        ));
    }
    let start = Instant::now() + Duration::from_millis(20);
    let phases = match load.count {
        // Counted: measured from the start; the end is when the last
        // request completes (a day is only an upper bound).
        Some(_) => Phases {
            measure_from: start,
            end: start + Duration::from_secs(86_400),
        },
        None => Phases {
            measure_from: start + load.warmup,
            end: start + load.warmup + load.time,
        },
    };
    let cpu_before = std::sync::Mutex::new(None::<(Option<f64>, f64, Instant)>);
    let results = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, q) in conn.queues.into_iter().enumerate() {
            let seed = load.seed.wrapping_mul(1000).wrapping_add(i as u64);
            let h = std::thread::Builder::new()
                .name(format!("bench-q{i}"))
                .spawn_scoped(s, move || queue_loop(q, load, blocks, seed, phases))
                .map_err(BenchError::Thread)?;
            handles.push(h);
        }
        // Sample CPU at the start of the measured interval.
        let now = Instant::now();
        if phases.measure_from > now {
            std::thread::sleep(phases.measure_from - now);
        }
        *cpu_before.lock().unwrap_or_else(|p| p.into_inner()) = Some((
            load.backend_pid.and_then(process_cpu_s),
            self_cpu_s(),
            Instant::now(),
        ));
        let now = Instant::now();
        if load.count.is_none() && phases.end > now {
            std::thread::sleep(phases.end - now);
        }
        let mut out = Vec::new();
        for (i, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(r) => out.push(r?),
                Err(_) => return Err(BenchError::Panicked(i)),
            }
        }
        let after = (
            load.backend_pid.and_then(process_cpu_s),
            self_cpu_s(),
            Instant::now(),
        );
        Ok((out, after))
    });
    let (results, after) = results?;
    let before = cpu_before
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .ok_or_else(|| BenchError::Backend("no CPU sample".into()))?;
    let mut latency = Hist::new_latency();
    let (mut requests, mut errors, mut bytes) = (0, 0, 0);
    for r in &results {
        latency.merge(&r.latency);
        requests += r.requests;
        errors += r.errors;
        bytes += r.bytes;
    }
    let seconds = match load.count {
        Some(_) => after.2.saturating_duration_since(before.2).as_secs_f64(),
        None => load.time.as_secs_f64(),
    };
    let backend_cpu_s = match (before.0, after.0) {
        (Some(a), Some(b)) => Some((b - a).max(0.0)),
        (None, _) if load.backend_pid.is_some() => {
            return Err(BenchError::Backend(format!(
                "cannot read /proc/{}/stat",
                load.backend_pid.unwrap_or(0)
            )))
        }
        _ => None,
    };
    let iops = requests as f64 / seconds;
    Ok(BenchReport {
        load: load.describe(),
        requests,
        errors,
        seconds,
        iops,
        bytes_per_s: bytes as f64 / seconds,
        latency_ns: latency.summary(),
        backend_cpu_s,
        iops_per_backend_cpu_s: backend_cpu_s
            .filter(|c| *c > 0.0)
            .map(|c| requests as f64 / c),
        client_cpu_s: (after.1 - before.1).max(0.0),
    })
}

/// One queue's closed loop: keep `depth` requests in flight until the end,
/// then collect the stragglers.
fn queue_loop(
    mut queue: Queue,
    load: &Load,
    blocks: u64,
    seed: u64,
    phases: Phases,
) -> Result<QueueResult, BenchError> {
    let depth = load.depth;
    let bs = load.bs;
    let mut rng = Rng(seed);
    let mut issued_at = vec![phases.measure_from; depth];
    let mut res = QueueResult {
        requests: 0,
        errors: 0,
        bytes: 0,
        latency: Hist::new_latency(),
    };
    let mut comps: Vec<MaybeUninit<Completion>> =
        (0..depth).map(|_| MaybeUninit::uninit()).collect();
    let submit = |queue: &mut Queue, slot: usize, rng: &mut Rng| {
        let off = (rng.next() % blocks) * bs as u64;
        let write = match load.rw {
            RwMode::Randread => false,
            RwMode::Randwrite => true,
            RwMode::Randrw => rng.next() & 1 == 1,
        };
        // slot < depth: inside this queue's `depth * bs` bytes.
        let buf = queue.ptr(slot * bs, bs);
        if write {
            queue.q.write(off, buf, bs, slot, ReqFlags::empty());
        } else {
            queue.q.read(off, buf, bs, slot, ReqFlags::empty());
        }
    };
    // Wait for the start line so every queue begins together.
    let warmup = if load.count.is_some() {
        Duration::ZERO
    } else {
        load.warmup
    };
    let start = phases
        .measure_from
        .checked_sub(warmup)
        .unwrap_or(phases.measure_from);
    let now = Instant::now();
    if start > now {
        std::thread::sleep(start - now);
    }
    let now = Instant::now();
    let first_batch = load.count.map_or(depth, |n| {
        depth.min(usize::try_from(n).unwrap_or(usize::MAX))
    });
    for (slot, t) in issued_at.iter_mut().enumerate().take(first_batch) {
        *t = now;
        submit(&mut queue, slot, &mut rng);
    }
    let mut issued = first_batch as u64;
    let mut outstanding = first_batch;
    let mut ending = false;
    while outstanding > 0 {
        let mut timeout = Duration::from_secs(30);
        let got = queue
            .q
            .do_io(&mut comps, 1, Some(&mut timeout), None)
            .map_err(blkio_err("do_io"))?;
        if got == 0 {
            return Err(BenchError::Backend(format!(
                "no completion within 30 s ({outstanding} requests in flight)"
            )));
        }
        let now = Instant::now();
        let measuring = now >= phases.measure_from && now < phases.end;
        if now >= phases.end {
            ending = true;
        }
        for c in &comps[..got] {
            // SAFETY: do_io initialised the first `got` entries.
            let c = unsafe { c.assume_init_ref() };
            let slot = c.user_data;
            if measuring {
                res.requests += 1;
                res.bytes += bs as u64;
                if c.ret != 0 {
                    res.errors += 1;
                }
                res.latency
                    .record(now.saturating_duration_since(issued_at[slot]).as_nanos() as u64);
            } else if c.ret != 0 {
                // Errors count even outside the measured interval.
                res.errors += 1;
            }
            if ending || load.count.is_some_and(|n| issued >= n) {
                outstanding -= 1;
            } else {
                if !load.think.is_zero() {
                    std::thread::sleep(load.think);
                }
                issued_at[slot] = Instant::now();
                submit(&mut queue, slot, &mut rng);
                issued += 1;
            }
        }
    }
    Ok(res)
}
