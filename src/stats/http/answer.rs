//! The endpoint's answers: what a request head gets (`GET`/`HEAD` of
//! `/metrics` and `/`, 404, 405, 400, 408, 431, 500), each written within
//! the connection's deadline and followed by a bounded lingering close.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::head::Head;
use super::{LINGER, MAX_LINGER_BYTES, POLL_INTERVAL};
use crate::stats::prometheus::{render, CONTENT_TYPE};
use crate::stats::queue::StatsDocument;

const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

const INDEX_HTML: &str =
    "<html><head><title>blklab</title></head><body><a href=\"/metrics\">Metrics</a></body></html>\n";

/// One answer; every answer closes the connection.
pub(super) struct Answer {
    code: u16,
    content_type: &'static str,
    body: String,
    /// A `HEAD` request: the headers (with the body's length) only.
    head_only: bool,
    /// Further header lines, each ending in CRLF.
    extra: &'static str,
}

impl Answer {
    fn text(code: u16, body: String, head_only: bool) -> Self {
        Answer {
            code,
            content_type: TEXT_PLAIN,
            body,
            head_only,
            extra: "",
        }
    }

    /// The answer to a refused head: its status and reason.
    fn refusal(code: u16) -> Self {
        Self::text(code, format!("{}\n", reason(code)), false)
    }
}

/// The answer to `head`, `None` when there is nothing to answer.
/// `/metrics` renders `source()` afresh; a panicking source answers 500
/// and leaves the server running.
pub(super) fn answer(
    head: Head,
    source: &(dyn Fn() -> StatsDocument + Send + Sync),
) -> Option<Answer> {
    let (method, path) = match head {
        Head::Nothing => return None,
        Head::Refused(code) => return Some(Answer::refusal(code)),
        Head::Request { method, path } => (method, path),
    };
    let head_only = method == "HEAD";
    let known = matches!(path.as_str(), "/" | "/metrics");
    Some(if !known {
        Answer::text(404, "Not Found\n".into(), head_only)
    } else if method != "GET" && !head_only {
        Answer {
            extra: "Allow: GET, HEAD\r\n",
            ..Answer::refusal(405)
        }
    } else if path == "/" {
        Answer {
            content_type: "text/html; charset=utf-8",
            ..Answer::text(200, INDEX_HTML.into(), head_only)
        }
    } else {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| render(&source()))) {
            Ok(text) => Answer {
                content_type: CONTENT_TYPE,
                ..Answer::text(200, text, head_only)
            },
            Err(_) => Answer::text(500, "statistics unavailable\n".into(), head_only),
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

/// Write `answer` before `deadline`.
pub(super) fn send(stream: &mut TcpStream, deadline: Instant, answer: &Answer) -> io::Result<()> {
    let mut msg = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
        answer.code,
        reason(answer.code),
        answer.content_type,
        answer.body.len(),
        answer.extra,
    );
    if !answer.head_only {
        msg.push_str(&answer.body);
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

/// Lingering close: stop sending, then drain briefly whatever the client
/// still sends, so closing with unread data does not reset the connection
/// before the client has read the answer. Bounded by
/// [`MAX_LINGER_BYTES`], by [`LINGER`] and by `deadline`, whatever the
/// client does (a trickle of bytes must not keep the connection).
pub(super) fn linger(stream: &mut TcpStream, deadline: Instant, shutdown: &AtomicBool) {
    let _ = stream.shutdown(Shutdown::Write);
    let end = deadline.min(Instant::now() + LINGER);
    let mut sink = [0u8; 1024];
    let mut drained = 0;
    while drained < MAX_LINGER_BYTES && !shutdown.load(Ordering::SeqCst) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero()
            || stream
                .set_read_timeout(Some(left.min(POLL_INTERVAL)))
                .is_err()
        {
            break;
        }
        match stream.read(&mut sink) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A read timeout without data: the client is quiet.
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_routes() {
        let source = || -> StatsDocument { StatsDocument::new(Vec::new()) };
        let route = |method: &str, path: &str| {
            let head = Head::Request {
                method: method.into(),
                path: path.into(),
            };
            let a = answer(head, &source).expect("an answer");
            (a.code, a.head_only, a.extra)
        };
        assert_eq!(route("GET", "/metrics"), (200, false, ""));
        assert_eq!(route("HEAD", "/metrics"), (200, true, ""));
        assert_eq!(route("GET", "/"), (200, false, ""));
        assert_eq!(route("HEAD", "/nope"), (404, true, ""));
        assert_eq!(route("POST", "/"), (405, false, "Allow: GET, HEAD\r\n"));
        assert!(answer(Head::Nothing, &source).is_none());
        let refused = answer(Head::Refused(431), &source).unwrap();
        assert_eq!(refused.body, "Request Header Fields Too Large\n");
        let panics = || -> StatsDocument { panic!("no statistics") };
        let head = Head::Request {
            method: "GET".into(),
            path: "/metrics".into(),
        };
        assert_eq!(answer(head, &panics).unwrap().code, 500);
    }

    /// A client that does not read its answer holds the connection until
    /// the deadline, not longer: `send` gives up once the socket's buffers
    /// are full and the deadline has passed.
    #[test]
    fn metrics_send_gives_up_at_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        // A small send buffer, so that the answer cannot be buffered whole.
        let small: libc::c_int = 4096;
        // SAFETY: a valid socket, and a c_int option of its size.
        let rc = unsafe {
            libc::setsockopt(
                std::os::unix::io::AsRawFd::as_raw_fd(&server),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        let big = Answer::text(200, "x".repeat(32 << 20), false);
        let t = Instant::now();
        let deadline = t + std::time::Duration::from_millis(300);
        let e = send(&mut server, deadline, &big).expect_err("the client never reads");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{e}"
        );
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
    }
}
