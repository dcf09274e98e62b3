//! The loopback HTTP endpoint of `blklab serve --metrics`: a tiny HTTP/1.1
//! server that answers `GET /metrics` with the Prometheus exposition
//! ([`crate::stats::prometheus::render`]) of a stats document built fresh
//! from a caller-supplied closure on every scrape. It uses only `std` (no
//! HTTP crate: one GET, one answer, `Connection: close` needs none, and
//! the limits below are simplest to state over plain sockets).
//!
//! **Limits.** An accept thread hands each connection to its own thread,
//! at most [`MAX_CONNECTIONS`] at once (another gets 503 and is closed at
//! once, without blocking the accept thread). A connection has
//! [`READ_TIMEOUT`] to send its request head (at most [`MAX_HEAD`] bytes;
//! a body is not read) and [`CONNECTION_DEADLINE`] in total, for the head,
//! taking the answer and the lingering close (which drains at most 64 KiB
//! for at most [`LINGER`]). So a slow or trickling client holds one slot
//! for at most [`CONNECTION_DEADLINE`] and never delays another scrape,
//! and shutdown never waits for a client: the accept thread stops within
//! 100 ms, and connection threads stop at their deadline or when they see
//! the shutdown flag (within 100 ms).
//!
//! **Binding.** The default address is loopback, [`DEFAULT_ADDR`]
//! (`127.0.0.1:9188`): the metrics name socket paths and the build, and the
//! server has no authentication or TLS. Binding to another address (e.g.
//! `0.0.0.0:9188`) exposes them to whoever can reach it; that is the
//! user's explicit choice.

use crate::util::log_limit::LogLimit;
use crate::util::slots::Slot;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, warn};

use crate::stats::prometheus::{render, CONTENT_TYPE};
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
/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// How often the accept loop and connection threads look at the shutdown
/// flag.
const POLL_INTERVAL_MS: i32 = 100;
/// Largest request head (request line and headers) we read.
pub(crate) const MAX_HEAD: usize = 8192;

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
        if !crate::util::fd::readable_within(fd, POLL_INTERVAL_MS) {
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
                std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS as u64));
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

/// What a request head turned out to be.
#[derive(Debug, PartialEq)]
enum Request {
    /// Method and path (query string removed).
    Ok { method: String, path: String },
    /// Answer 400.
    Bad,
}

/// Parse an HTTP/1.x request line.
fn parse_request_line(line: &[u8]) -> Request {
    let Ok(line) = std::str::from_utf8(line) else {
        return Request::Bad;
    };
    let line = line.strip_suffix('\r').unwrap_or(line);
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Request::Bad;
    };
    let token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic());
    if !token(method) || !target.starts_with('/') || !version.starts_with("HTTP/1.") {
        return Request::Bad;
    }
    if target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Request::Bad;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Request::Ok {
        method: method.to_string(),
        path: path.to_string(),
    }
}

/// Check the header lines of a complete head (after the request line).
fn headers_ok(head: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(head) else {
        return false;
    };
    text.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.is_empty())
        .all(|l| matches!(l.split_once(':'), Some((name, _)) if !name.is_empty() && !name.contains([' ', '\t'])))
}

/// Read a request head within [`READ_TIMEOUT`]. `Ok(None)`: the client
/// closed without sending anything.
fn read_head(
    stream: &mut TcpStream,
    shutdown: &AtomicBool,
) -> io::Result<Option<Result<Request, u16>>> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let mut request: Option<Request> = None;
    loop {
        if request.is_none() {
            if let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                // Request line complete: reject a malformed one at once.
                match parse_request_line(&buf[..nl]) {
                    Request::Bad => return Ok(Some(Ok(Request::Bad))),
                    r => request = Some(r),
                }
            }
        }
        if request.is_some() {
            if let Some(end) = find_head_end(&buf) {
                let nl = buf.iter().position(|&b| b == b'\n').unwrap_or(0);
                if !headers_ok(&buf[nl + 1..end]) {
                    return Ok(Some(Ok(Request::Bad)));
                }
                return Ok(request.take().map(Ok));
            }
        }
        if buf.len() > MAX_HEAD {
            return Ok(Some(Err(431)));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() && buf.is_empty() {
            // Connected and sent nothing: close without an answer.
            return Ok(None);
        }
        if left.is_zero() {
            return Ok(Some(Err(408)));
        }
        if shutdown.load(Ordering::SeqCst) {
            return Ok(None);
        }
        stream.set_read_timeout(Some(
            left.min(Duration::from_millis(POLL_INTERVAL_MS as u64)),
        ))?;
        match stream.read(&mut chunk) {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => return Ok(Some(Ok(Request::Bad))),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // Poll tick: check the deadline and shutdown again.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Where the header lines end, once the blank line that ends the head
/// ("\r\n\r\n", or leniently "\n\n") has arrived: the index of that blank
/// line, so the headers are `buf[request line end + 1 .. end]`.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find_map(|i| {
        if buf[i..].starts_with(b"\r\n\r\n") {
            Some(i + 2)
        } else if buf[i..].starts_with(b"\n\n") {
            Some(i + 1)
        } else {
            None
        }
    })
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Error",
    }
}

fn respond(
    stream: &mut TcpStream,
    deadline: Instant,
    code: u16,
    content_type: &str,
    body: &str,
    head_only: bool,
    extra: &str,
) -> io::Result<()> {
    let mut msg = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        reason(code),
        body.len()
    );
    if !head_only {
        msg.push_str(body);
    }
    // In pieces, each with what is left of the connection's deadline, so
    // a client that reads slowly cannot stretch it.
    for piece in msg.as_bytes().chunks(16 * 1024) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection deadline passed while sending the answer",
            ));
        }
        stream.set_write_timeout(Some(left))?;
        stream.write_all(piece)?;
    }
    stream.flush()
}

const INDEX_HTML: &str =
    "<html><head><title>blklab</title></head><body><a href=\"/metrics\">Metrics</a></body></html>\n";

fn handle_connection(
    mut stream: TcpStream,
    source: &(dyn Fn() -> StatsDocument + Send + Sync),
    shutdown: &AtomicBool,
) -> io::Result<()> {
    let deadline = Instant::now() + CONNECTION_DEADLINE;
    // An accepted socket need not inherit the listener's O_NONBLOCK, but
    // be explicit.
    stream.set_nonblocking(false)?;
    let text_plain = "text/plain; charset=utf-8";
    let stream = &mut stream;
    let result = match read_head(stream, shutdown)? {
        None => return Ok(()),
        Some(Err(code)) => respond(
            stream,
            deadline,
            code,
            text_plain,
            &format!("{}\n", reason(code)),
            false,
            "",
        ),
        Some(Ok(Request::Bad)) => respond(
            stream,
            deadline,
            400,
            text_plain,
            "Bad Request\n",
            false,
            "",
        ),
        Some(Ok(Request::Ok { method, path })) => {
            let head = method == "HEAD";
            let known = matches!(path.as_str(), "/" | "/metrics");
            if !known {
                respond(stream, deadline, 404, text_plain, "Not Found\n", head, "")
            } else if method != "GET" && !head {
                respond(
                    stream,
                    deadline,
                    405,
                    text_plain,
                    "Method Not Allowed\n",
                    false,
                    "Allow: GET, HEAD\r\n",
                )
            } else if path == "/" {
                respond(
                    stream,
                    deadline,
                    200,
                    "text/html; charset=utf-8",
                    INDEX_HTML,
                    head,
                    "",
                )
            } else {
                // A panicking source must not take the server down.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| render(&source()))) {
                    Ok(text) => respond(stream, deadline, 200, CONTENT_TYPE, &text, head, ""),
                    Err(_) => respond(
                        stream,
                        deadline,
                        500,
                        text_plain,
                        "statistics unavailable\n",
                        head,
                        "",
                    ),
                }
            }
        }
    };
    // Lingering close: stop sending, then drain briefly whatever the client
    // still sends, so closing with unread data does not reset the
    // connection before the client has read the answer. Bounded in bytes,
    // by LINGER and by the connection's deadline, whatever the client
    // does (a trickle of bytes must not keep the connection).
    let _ = stream.shutdown(Shutdown::Write);
    let linger_end = deadline.min(Instant::now() + LINGER);
    let mut sink = [0u8; 1024];
    let mut drained = 0;
    while drained < 64 * 1024 && !shutdown.load(Ordering::SeqCst) {
        let left = linger_end.saturating_duration_since(Instant::now());
        if left.is_zero()
            || stream
                .set_read_timeout(Some(left.min(Duration::from_millis(100))))
                .is_err()
        {
            break;
        }
        match stream.read(&mut sink) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A 100 ms read timeout without data: the client is quiet.
            Err(_) => break,
        }
    }
    result
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

    #[test]
    fn metrics_request_lines() {
        assert_eq!(
            parse_request_line(b"GET /metrics?x=1 HTTP/1.1\r"),
            Request::Ok {
                method: "GET".into(),
                path: "/metrics".into()
            }
        );
        for bad in [
            &b"garbage"[..],
            b"GET /metrics",
            b"GET  /metrics HTTP/1.1",
            b"GET metrics HTTP/1.1",
            b"GET /metrics HTTP/2",
            b"\xff\xfe / HTTP/1.1",
        ] {
            assert_eq!(parse_request_line(bad), Request::Bad, "{bad:?}");
        }
        assert!(headers_ok(b"Host: x\r\nAccept: */*\r\n"));
        assert!(!headers_ok(b"Host x\r\n"));
    }
}
