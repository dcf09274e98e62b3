//! A serving daemon's life (`blklab serve`): block SIGINT and SIGTERM, start
//! the disks with their control socket and the Prometheus endpoint, wait
//! for a signal, stop gracefully (a second signal cuts the wait for
//! requests in service short), and write the final statistics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::backend::server::{self, ServeError, Server};
use crate::backend::{control, Disk};
use crate::device::config::DiskConfig;

/// What a daemon serves, and where it reports.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub disks: Vec<DiskConfig>,
    /// The control socket.
    pub control: Option<PathBuf>,
    /// The Prometheus endpoint's address.
    pub metrics: Option<SocketAddr>,
    /// Where the final statistics (JSON) go at exit.
    pub stats_out: Option<PathBuf>,
    /// How long a stop waits for requests in service to reach their
    /// emulated completion time before completing them at once.
    pub drain_timeout: Duration,
}

/// What can end a daemon with an error. The messages name the option
/// that asked for the failing part, as the user gave it.
#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("cannot block signals")]
    BlockSignals(#[source] std::io::Error),
    #[error(transparent)]
    Start(#[from] ServeError),
    #[error("cannot serve --metrics on {addr}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write --stats-out {}", path.display())]
    StatsOut {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Serve `opts` until SIGINT or SIGTERM, then stop gracefully: every
/// request in service completes onto its used ring before the
/// connections close (see [`Server::shutdown_within`]).
pub fn run(opts: ServeOptions) -> Result<(), DaemonError> {
    // Block SIGINT/SIGTERM before any thread starts, so every thread
    // inherits the mask and only the waits below receive them.
    let signals = server::block_termination_signals().map_err(DaemonError::BlockSignals)?;
    let server = Server::start_with_control(opts.disks, opts.control.as_deref())?;
    let metrics = match opts.metrics {
        Some(addr) => Some(Metrics::start(&server, addr)?),
        None => None,
    };
    let sig = server::wait_for_signal(&signals);
    log::info!("received {sig}, stopping");
    let served = server.disks();
    let identity = server.identity().clone();
    hurry_on_second_signal(signals, served.clone());
    server.shutdown_within(opts.drain_timeout);
    if let Some(m) = metrics {
        m.stop();
    }
    if let Some(path) = opts.stats_out {
        control::write_stats_file(&path, &identity, &served)
            .map_err(|source| DaemonError::StatsOut { path, source })?;
    }
    Ok(())
}

/// A second SIGINT or SIGTERM during the stop: the requests still in
/// service complete at once, without waiting for their emulated
/// completion time (still onto the used ring, before the connections
/// close). The thread waits for that signal until the process exits.
fn hurry_on_second_signal(signals: libc::sigset_t, disks: Vec<Arc<Disk>>) {
    let spawned = std::thread::Builder::new()
        .name("blklab-signal".into())
        .spawn(move || {
            let sig = server::wait_for_signal(&signals);
            log::info!("received {sig} again: completing the requests in service at once");
            for d in &disks {
                d.end_stop_wait();
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot watch for a second signal: {e}");
    }
}

/// The Prometheus endpoint over the server's disks.
struct Metrics {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Metrics {
    fn start(server: &Server, addr: SocketAddr) -> Result<Metrics, DaemonError> {
        let disks = server.disks();
        let identity = server.identity().clone();
        let source = Arc::new(move || control::report(&identity, &disks, None));
        let stop = Arc::new(AtomicBool::new(false));
        let (bound, thread) = crate::stats::http::serve(addr, source, stop.clone())
            .map_err(|source| DaemonError::Metrics { addr, source })?;
        log::info!("Prometheus metrics on http://{bound}/metrics");
        Ok(Metrics { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}
