//! A request head read within the endpoint's limits: at most
//! [`MAX_HEAD`] bytes within [`READ_TIMEOUT`], parsed by `httparse` (the
//! request line's method, target and version, header names and values,
//! line endings), the read a loop of short timeouts that also watches the
//! shutdown flag. A body is never read.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::{MAX_HEAD, POLL_INTERVAL, READ_TIMEOUT};

/// Most header lines a head may have (within [`MAX_HEAD`] bytes); more
/// are answered like a head over [`MAX_HEAD`].
const MAX_HEADERS: usize = 64;

/// What a connection sent.
#[derive(Debug, PartialEq)]
pub(super) enum Head {
    /// Nothing to answer: the client closed or stayed silent without
    /// sending a byte, or the server is shutting down.
    Nothing,
    /// A well-formed request: its method and path (query and fragment
    /// removed).
    Request { method: String, path: String },
    /// A head to refuse with this status: 400 (malformed), 408 (not
    /// complete within [`READ_TIMEOUT`]), 431 (too large).
    Refused(u16),
}

/// The head in `buf` if it is complete or already malformed; `None` while
/// it may still become a valid head.
fn parse(buf: &[u8]) -> Option<Head> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(buf) {
        Ok(httparse::Status::Partial) => None,
        Err(httparse::Error::TooManyHeaders) => Some(Head::Refused(431)),
        Err(_) => Some(Head::Refused(400)),
        Ok(httparse::Status::Complete(_)) => match (request.method, request.path) {
            (Some(method), Some(target)) if target.starts_with('/') => {
                let path = target.split(['?', '#']).next().unwrap_or(target);
                Some(Head::Request {
                    method: method.to_string(),
                    path: path.to_string(),
                })
            }
            _ => Some(Head::Refused(400)),
        },
    }
}

/// Read a request head within [`READ_TIMEOUT`].
pub(super) fn read_head(stream: &mut TcpStream, shutdown: &AtomicBool) -> io::Result<Head> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if !buf.is_empty() {
            if let Some(head) = parse(&buf) {
                return Ok(head);
            }
        }
        if buf.len() > MAX_HEAD {
            return Ok(Head::Refused(431));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // Connected and sent nothing: close without an answer.
            return Ok(if buf.is_empty() {
                Head::Nothing
            } else {
                Head::Refused(408)
            });
        }
        if shutdown.load(Ordering::SeqCst) {
            return Ok(Head::Nothing);
        }
        stream.set_read_timeout(Some(left.min(POLL_INTERVAL)))?;
        match stream.read(&mut chunk) {
            Ok(0) if buf.is_empty() => return Ok(Head::Nothing),
            Ok(0) => return Ok(Head::Refused(400)),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // Poll tick: check the deadline and shutdown again.
            Err(e) if is_tick(&e) => {}
            Err(e) => return Err(e),
        }
    }
}

/// A read that ended without data or error: its timeout (a poll tick) or
/// a signal.
fn is_tick(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, path: &str) -> Option<Head> {
        Some(Head::Request {
            method: method.into(),
            path: path.into(),
        })
    }

    #[test]
    fn metrics_request_heads() {
        assert_eq!(
            parse(b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
            request("GET", "/metrics")
        );
        assert_eq!(
            parse(b"HEAD / HTTP/1.0\nAccept: */*\n\n"),
            request("HEAD", "/")
        );
        // Not complete yet: read on.
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None);
        assert_eq!(parse(b"GET /metr"), None);
        for bad in [
            &b"garbage\r\n\r\n"[..],
            b"GET /metrics\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/2\r\n\r\n",
            b"\xff\xfe / HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",
            // Malformed before the head ends: refused at once.
            b"\x16\x03\x01\x02\x00",
        ] {
            assert_eq!(parse(bad), Some(Head::Refused(400)), "{bad:?}");
        }
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "a: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(parse(many.as_bytes()), Some(Head::Refused(431)));
    }
}
