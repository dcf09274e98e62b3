//! The loopback HTTP endpoint of `blklab serve --metrics`: a small
//! HTTP/1.1 server that answers `GET /metrics` with the Prometheus
//! exposition ([`crate::stats::prometheus::render`]) of a stats document
//! built fresh from a caller-supplied closure on every scrape.
//!
//! **Which crate does what.** `httparse` parses the request head
//! (`http/head.rs`); the sockets, threads and limits below are `std`'s,
//! and `http/answer.rs` writes the few fixed answers.
//!
//! **Limits.** An accept thread hands each connection to its own thread,
//! at most [`MAX_CONNECTIONS`] at once (another gets 503 and is closed at
//! once, without blocking the accept thread). A connection has
//! [`READ_TIMEOUT`] to send its request head (at most [`MAX_HEAD`] bytes
//! and 64 header lines, else 431; a body is not read) and
//! [`CONNECTION_DEADLINE`] in total, for the head, taking the answer and
//! the lingering close (which drains at most [`MAX_LINGER_BYTES`] for at
//! most [`LINGER`]). So a slow or trickling client holds one slot for at
//! most [`CONNECTION_DEADLINE`] and never delays another scrape, and
//! shutdown never waits for a client: the accept thread stops within
//! 100 ms, and connection threads stop at their deadline or when they see
//! the shutdown flag (within 100 ms). A scrape reads the statistics on its
//! connection's thread, never on a queue's worker.
//!
//! **Why no HTTP server crate.** `tiny_http` 0.12 (the small blocking
//! server `rouille` builds on) accepts and reads connections on threads of
//! its own that these limits cannot reach; measured against it with 300
//! silent connections: 236 threads (one per connection, no cap), a silent
//! connection still open after 15 s and a trickled head never closed (no
//! read timeout), and two clients that pipeline requests without reading
//! their answers held both threads that answer (its answers are written
//! without a deadline), so a third scrape got nothing within 10 s. `hyper` and the other servers
//! with timeouts need an async runtime (tokio), which the daemon has no
//! other use for.
//!
//! **Binding.** The default address is loopback, [`DEFAULT_ADDR`]
//! (`127.0.0.1:9188`): the metrics name socket paths and the build, and the
//! server has no authentication or TLS. Binding to another address (e.g.
//! `0.0.0.0:9188`) exposes them to whoever can reach it; that is the
//! user's explicit choice.

mod answer;
mod head;

use crate::util::log_limit::LogLimit;
use crate::util::slots::Slot;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, warn};

use crate::stats::queue::StatsDocument;

/// The address `--metrics` binds when given no other: loopback only.
#[cfg(test)]
pub(crate) const DEFAULT_ADDR: &str = "127.0.0.1:9188";

/// Time a client has to send its request head.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Everything a connection may take, from accept to close: the request
/// head, taking the answer, and the lingering close.
pub(crate) const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);
/// Longest lingering close (draining what the client still sends).
pub(crate) const LINGER: Duration = Duration::from_millis(500);
/// Most bytes the lingering close drains.
pub(crate) const MAX_LINGER_BYTES: usize = 64 * 1024;
/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// How often the accept loop and connection threads look at the shutdown
/// flag.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Largest request head (request line and headers) we read.
pub const MAX_HEAD: usize = 8192;

// ---------------------------------------------------------------------------
// Addresses

/// Parse a `--metrics` address: `127.0.0.1:9188`, `[::1]:9188`,
/// `localhost:9188`, `HOST:PORT`, or a bare port (`9188` or `:9188`),
/// which means loopback (`127.0.0.1:PORT`).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("bad port {p:?} in metrics address {s:?}"))
    };
    let loopback = |p: u16| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p);
    if t.is_empty() {
        return Err("empty metrics address; use e.g. 127.0.0.1:9188".into());
    }
    if let Some(p) = t.strip_prefix(':') {
        return port(p).map(loopback);
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return port(t).map(loopback);
    }
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    let Some((host, p)) = t.rsplit_once(':') else {
        return Err(format!(
            "metrics address {s:?} has no port; use HOST:PORT, e.g. 127.0.0.1:9188"
        ));
    };
    let p = port(p)?;
    if host.is_empty() || host.contains(':') {
        return Err(format!(
            "bad metrics address {s:?}; IPv6 addresses go in brackets: [::1]:9188"
        ));
    }
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(loopback(p));
    }
    let addrs: Vec<SocketAddr> = (host, p)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve metrics address {s:?}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("metrics address {s:?} resolves to nothing"))
}

// ---------------------------------------------------------------------------
// HTTP

/// Serve metrics over HTTP on `addr` until `shutdown` is set.
///
/// `GET /metrics` (or `HEAD`) answers 200 with [`CONTENT_TYPE`] and
/// `render(&source())`, built fresh per request; `GET /` a one-line HTML
/// page linking to `/metrics`; other paths 404; other methods on these
/// paths 405; a malformed request 400; a request not received within 2 s
/// 408. Every answer closes the connection (`Connection: close`).
///
/// Connections are served on threads of their own, within the limits in
/// the module documentation. The returned (accept) thread checks
/// `shutdown` at least every 100 ms and never waits for a client.
///
/// Returns the address actually bound (useful with port 0) and the thread.
/// The default address is loopback ([`DEFAULT_ADDR`]); see the module
/// documentation before binding anywhere else.
pub fn serve(
    addr: SocketAddr,
    source: Arc<dyn Fn() -> StatsDocument + Send + Sync>,
    shutdown: Arc<AtomicBool>,
) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let handle = std::thread::Builder::new()
        .name("blklab-metrics".into())
        .spawn(move || accept_loop(listener, source, shutdown))?;
    Ok((bound, handle))
}

fn accept_loop(
    listener: TcpListener,
    source: Arc<dyn Fn() -> StatsDocument + Send + Sync>,
    shutdown: Arc<AtomicBool>,
) {
    let fd = listener.as_raw_fd();
    let active = Arc::new(AtomicUsize::new(0));
    while !shutdown.load(Ordering::SeqCst) {
        if !crate::util::fd::readable_within(fd, POLL_INTERVAL.as_millis() as i32) {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                let Some(slot) = Slot::take(&active, MAX_CONNECTIONS) else {
                    debug!("metrics: {MAX_CONNECTIONS} connections open; refusing {peer}");
                    refuse(stream);
                    continue;
                };
                let (source, shutdown) = (source.clone(), shutdown.clone());
                let spawned = std::thread::Builder::new()
                    .name("blklab-metrics-conn".into())
                    .spawn(move || {
                        let _slot = slot;
                        if let Err(e) = handle_connection(stream, &*source, &shutdown) {
                            debug!("metrics connection from {peer}: {e}");
                        }
                    });
                if let Err(e) = spawned {
                    static SPAWN: LogLimit = LogLimit::new(Duration::from_secs(10));
                    if let Some(held) = SPAWN.event() {
                        warn!(
                            "metrics: cannot start a connection thread: {e}{}",
                            LogLimit::held_note(held)
                        );
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // E.g. EMFILE: back off instead of spinning, and log a
                // line per 10 s at most while it lasts.
                static ACCEPT: LogLimit = LogLimit::new(Duration::from_secs(10));
                if let Some(held) = ACCEPT.event() {
                    warn!("metrics: accept failed: {e}{}", LogLimit::held_note(held));
                }
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }
}

/// Answer 503 to a connection over the cap and close it, never blocking
/// (a fresh socket's send buffer takes the few bytes).
fn refuse(stream: TcpStream) {
    let _ = stream.set_nonblocking(true);
    let body = "Service Unavailable: too many connections\n";
    let msg = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = (&stream).write_all(msg.as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
}

/// Serve one connection within [`CONNECTION_DEADLINE`]: read its head,
/// answer it, close lingering.
fn handle_connection(
    mut stream: TcpStream,
    source: &(dyn Fn() -> StatsDocument + Send + Sync),
    shutdown: &AtomicBool,
) -> io::Result<()> {
    let deadline = Instant::now() + CONNECTION_DEADLINE;
    // An accepted socket need not inherit the listener's O_NONBLOCK, but
    // be explicit.
    stream.set_nonblocking(false)?;
    let head = head::read_head(&mut stream, shutdown)?;
    let Some(answer) = answer::answer(head, source) else {
        return Ok(());
    };
    let sent = answer::send(&mut stream, deadline, &answer);
    answer::linger(&mut stream, deadline, shutdown);
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_parse_addr() {
        let v4 = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        assert_eq!(parse_addr("127.0.0.1:9188"), Ok(v4(9188)));
        assert_eq!(parse_addr("9188"), Ok(v4(9188)));
        assert_eq!(parse_addr(":9188"), Ok(v4(9188)));
        assert_eq!(parse_addr("localhost:9188"), Ok(v4(9188)));
        assert_eq!(parse_addr(DEFAULT_ADDR), Ok(v4(9188)));
        assert_eq!(
            parse_addr("[::1]:9188"),
            Ok("[::1]:9188".parse::<SocketAddr>().unwrap())
        );
        assert_eq!(
            parse_addr("0.0.0.0:0"),
            Ok(SocketAddr::from(([0, 0, 0, 0], 0)))
        );
        for bad in ["", ":", "99999", "127.0.0.1", "::1:9188", "host:port", ":x"] {
            assert!(parse_addr(bad).is_err(), "{bad:?}");
        }
    }
}
