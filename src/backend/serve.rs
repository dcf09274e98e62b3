//! A serving daemon's life (`blklab serve`): block SIGINT and SIGTERM, start
//! the disks with their control socket and the Prometheus endpoint, wait
//! for a signal, shut down, and write the final statistics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use thiserror::Error;

use crate::backend::control;
use crate::backend::server::{self, ServeError, Server};
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

/// Serve `opts` until SIGINT or SIGTERM, then shut down cleanly.
pub fn run(opts: ServeOptions) -> Result<(), DaemonError> {
    // Block SIGINT/SIGTERM before any thread starts, so every thread
    // inherits the mask and only the wait below receives them.
    let signals = server::block_termination_signals().map_err(DaemonError::BlockSignals)?;
    let server = Server::start_with_control(opts.disks, opts.control.as_deref())?;
    let metrics = match opts.metrics {
        Some(addr) => Some(Metrics::start(&server, addr)?),
        None => None,
    };
    let sig = server::wait_for_signal(&signals);
    log::info!("received {sig}, shutting down");
    let served = server.disks();
    server.shutdown();
    if let Some(m) = metrics {
        m.stop();
    }
    if let Some(path) = opts.stats_out {
        control::write_stats_file(&path, &served)
            .map_err(|source| DaemonError::StatsOut { path, source })?;
    }
    Ok(())
}

/// The Prometheus endpoint over the server's disks.
struct Metrics {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Metrics {
    fn start(server: &Server, addr: SocketAddr) -> Result<Metrics, DaemonError> {
        let disks = server.disks();
        let source = Arc::new(move || control::report(&disks, None));
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
