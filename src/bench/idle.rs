//! What a backend costs when its disk is idle: a client connects, runs a
//! short QD1 load (so a polling backend has polled, and an adaptive one
//! has grown its window), then stays connected without I/O; after a
//! settling pause the backend's CPU time is measured over a span, in
//! nanoseconds (`/proc/PID/task/*/schedstat`), as a share of one CPU.

use std::mem::MaybeUninit;
use std::path::Path;
use std::time::{Duration, Instant};

use blkio::{Completion, ReqFlags};
use serde::Serialize;

use super::client::{Connection, QueueSetup};
use super::{blkio_err, BenchError};
use crate::util::schedstat::process_cpu_ns;

/// How the idle cost is measured.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IdleSpec {
    /// The QD1 load before going idle.
    pub load: Duration,
    /// Idle time before the measurement starts (adaptive windows shrink,
    /// spins run out).
    pub settle: Duration,
    /// The measured idle span.
    pub span: Duration,
}

impl IdleSpec {
    pub(crate) const DEFAULT: IdleSpec = IdleSpec {
        load: Duration::from_millis(300),
        settle: Duration::from_millis(200),
        span: Duration::from_secs(2),
    };
}

/// A backend's CPU over an idle span.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IdleCpu {
    /// CPU time over the span, ns.
    pub cpu_ns: u64,
    pub span_s: f64,
    /// `cpu_ns` as a percentage of one CPU over the span.
    pub pct_of_cpu: f64,
}

/// Measure backend `pid` serving `socket` idle, as [`IdleSpec`] says.
pub(crate) fn measure(socket: &Path, pid: i32, spec: IdleSpec) -> Result<IdleCpu, BenchError> {
    let setup = QueueSetup {
        queues: 1,
        queue_size: 64,
        poll: false,
        buf_per_queue: 4096,
    };
    let mut conn = Connection::open(socket, false, setup)?;
    let q = conn
        .queues
        .first_mut()
        .ok_or(BenchError::Stalled { in_flight: 0 })?;
    let mut comps = [MaybeUninit::<Completion>::uninit()];
    let end = Instant::now() + spec.load;
    while Instant::now() < end {
        let buf = q.ptr(0, 4096);
        q.q.read(0, buf, 4096, 0, ReqFlags::empty());
        let mut timeout = Duration::from_secs(30);
        let got =
            q.q.do_io(&mut comps, 1, Some(&mut timeout), None)
                .map_err(blkio_err("do_io"))?;
        if got == 0 {
            return Err(BenchError::Stalled { in_flight: 1 });
        }
    }
    std::thread::sleep(spec.settle);
    let cpu = || process_cpu_ns(pid).ok_or(BenchError::Schedstat { pid });
    let (before, at) = (cpu()?, Instant::now());
    std::thread::sleep(spec.span);
    let (after, span) = (cpu()?, at.elapsed());
    drop(conn);
    let cpu_ns = after.saturating_sub(before);
    Ok(IdleCpu {
        cpu_ns,
        span_s: span.as_secs_f64(),
        pct_of_cpu: cpu_ns as f64 / span.as_nanos() as f64 * 100.0,
    })
}
