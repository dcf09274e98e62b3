//! The control socket: JSON lines over a Unix socket, to read statistics
//! while the daemon runs.
//!
//! Each request is one line, either plain words or a JSON object:
//! - `stats` / `{"cmd":"stats"}`: everything since start (or the last reset);
//! - `snapshot LABEL` / `{"cmd":"snapshot","label":"LABEL"}`: the delta since
//!   the previous snapshot (or start/reset), with the wall time it covers;
//! - `reset`: zero every statistic;
//! - `config`: every disk's configuration, version and git commit, and the
//!   daemon's identity;
//! - `prom`: `{"prometheus": TEXT}`, the statistics in Prometheus format.
//!
//! Each answer is one JSON line; errors are `{"error": "..."}`.
//!
//! Limits (a local client must not be able to exhaust the daemon): a line
//! is at most [`MAX_LINE`] bytes (a longer one is answered with an error
//! quoting a short prefix, and the connection is closed); at most
//! [`MAX_CONNECTIONS`] connections are served at once (another one is
//! answered with an error and closed); a connection that sends no
//! complete line within [`IDLE_TIMEOUT`] (of connecting or of its
//! previous answer) is closed; an answer the client does not take within
//! [`IDLE_TIMEOUT`] closes the connection; and a failing `accept` (e.g.
//! EMFILE) backs off for [`ACCEPT_BACKOFF`] instead of spinning.

use crate::util::log_limit::LogLimit;
use crate::util::slots::Slot;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{info, warn};
use serde::Deserialize;
use serde_json::{json, Value};
use vmm_sys_util::eventfd::EventFd;

use crate::backend::Disk;
use crate::stats::daemon::DaemonIdentity;
use crate::stats::queue::{DiskReport, QueueStats, StatsDocument};

/// Longest request line (bytes, newline excluded) the control socket reads.
pub const MAX_LINE: usize = 64 * 1024;
/// Most control connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a connection may take to send a complete line (counted from
/// connecting or from the previous answer), and to take an answer.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after a failed `accept` (e.g. EMFILE/ENFILE) before trying again.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);
/// How much of a bad line an error message quotes.
const QUOTE_PREFIX: usize = 64;

/// `text` for an error message: at most [`QUOTE_PREFIX`] characters,
/// with `…` when cut.
fn quote_prefix(text: &str) -> String {
    match text.char_indices().nth(QUOTE_PREFIX) {
        Some((i, _)) => format!("{:?}…", &text[..i]),
        None => format!("{text:?}"),
    }
}

/// What a delta is taken against: each disk's connection generation and
/// every queue's statistics, as of one moment ([`baselines`]).
#[derive(Clone)]
pub(crate) struct Baseline {
    disks: Vec<DiskBaseline>,
}

#[derive(Clone)]
struct DiskBaseline {
    connections: u64,
    queues: Vec<QueueStats>,
}

/// The stats document of `daemon`'s `disks`, as deltas against `base`
/// when given.
pub(crate) fn report(
    daemon: &DaemonIdentity,
    disks: &[Arc<Disk>],
    base: Option<&Baseline>,
) -> StatsDocument {
    let reports = disks
        .iter()
        .enumerate()
        .map(|(d, disk)| {
            let base = base.and_then(|b| b.disks.get(d));
            let (connections, connected) = disk.connection();
            DiskReport {
                config: Some(disk.cfg.clone()),
                queues: (0..disk.stats.len())
                    .map(|q| {
                        let st = disk.queue_stats(q);
                        st.report(q, base.and_then(|b| b.queues.get(q)))
                    })
                    .collect(),
                tag_pools: disk.tag_pool_stats(),
                connections,
                connected,
                connections_at_start: base.map(|b| b.connections),
            }
        })
        .collect();
    let mut doc = StatsDocument::new(reports);
    doc.daemon = Some(daemon.clone());
    doc
}

/// Baselines of every disk and queue, for later deltas.
pub(crate) fn baselines(disks: &[Arc<Disk>]) -> Baseline {
    Baseline {
        disks: disks
            .iter()
            .map(|disk| DiskBaseline {
                connections: disk.connection().0,
                queues: (0..disk.stats.len())
                    .map(|q| disk.queue_stats(q).baseline())
                    .collect(),
            })
            .collect(),
    }
}

/// Zero every statistic.
pub(crate) fn reset(disks: &[Arc<Disk>]) {
    for disk in disks {
        for q in 0..disk.stats.len() {
            disk.queue_stats(q).reset();
        }
    }
}

/// State shared by the control connections.
struct Control {
    daemon: DaemonIdentity,
    disks: Vec<Arc<Disk>>,
    /// Baseline of the next snapshot and when it was taken.
    snapshot: Mutex<(Instant, Baseline)>,
}

impl Control {
    fn answer(&self, line: &str) -> Value {
        let (cmd, label) = parse_command(line);
        match cmd.as_str() {
            "stats" => to_value(&report(&self.daemon, &self.disks, None)),
            "snapshot" => {
                let mut snap = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
                let mut doc = report(&self.daemon, &self.disks, Some(&snap.1));
                let now = Instant::now();
                doc.label = Some(label.unwrap_or_default());
                doc.interval_s = Some(now.duration_since(snap.0).as_secs_f64());
                *snap = (now, baselines(&self.disks));
                to_value(&doc)
            }
            "reset" => {
                let mut snap = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
                reset(&self.disks);
                *snap = (Instant::now(), baselines(&self.disks));
                json!({"ok": true})
            }
            "prom" => {
                json!({"prometheus": crate::stats::prometheus::render(&report(&self.daemon, &self.disks, None))})
            }
            "config" => {
                let doc = StatsDocument::new(Vec::new());
                json!({
                    "blklab_version": doc.blklab_version,
                    "git_commit": doc.git_commit,
                    "daemon": self.daemon,
                    "disks": self.disks.iter().map(|d| d.cfg.clone()).collect::<Vec<_>>(),
                })
            }
            "" => {
                json!({"error": "empty command; use stats, snapshot LABEL, reset, config or prom"})
            }
            other => {
                json!({"error": format!("unknown command {}; use stats, snapshot LABEL, reset, config or prom", quote_prefix(other))})
            }
        }
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_else(|e| json!({"error": e.to_string()}))
}

/// `(command, label)` from a plain-words or JSON line.
fn parse_command(line: &str) -> (String, Option<String>) {
    let t = line.trim();
    if t.starts_with('{') {
        return match serde_json::from_str::<Value>(t) {
            Ok(v) => (
                v.get("cmd")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                v.get("label").and_then(Value::as_str).map(str::to_string),
            ),
            Err(_) => ("invalid-json".to_string(), None),
        };
    }
    let mut it = t.splitn(2, char::is_whitespace);
    let cmd = it.next().unwrap_or("").to_ascii_lowercase();
    let label = it
        .next()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    (cmd, label)
}

/// Serve the control socket on its own thread until `shutdown` is set and
/// `wake` becomes readable.
pub(crate) fn spawn(
    listener: UnixListener,
    daemon: DaemonIdentity,
    disks: Vec<Arc<Disk>>,
    shutdown: Arc<AtomicBool>,
    wake: Arc<EventFd>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let control = Arc::new(Control {
        snapshot: Mutex::new((Instant::now(), baselines(&disks))),
        daemon,
        disks,
    });
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("blklab-control".into())
        .spawn(move || {
            let fd = listener.as_raw_fd();
            let mut failing = false;
            loop {
                match crate::util::fd::listener_or_wake(fd, wake.as_raw_fd()) {
                    Ok(true) => {}
                    _ => return,
                }
                let stream = match listener.accept() {
                    Ok((stream, _)) => {
                        failing = false;
                        stream
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        // EMFILE/ENFILE/ENOMEM…: the connection stays
                        // queued and poll() keeps reporting it, so retrying
                        // at once would spin. Back off (still waking for
                        // shutdown), and log once per streak.
                        if !failing {
                            warn!(
                                "control socket: accept failed: {e}; retrying every {} ms",
                                ACCEPT_BACKOFF.as_millis()
                            );
                            failing = true;
                        }
                        if crate::util::fd::readable_within(
                            wake.as_raw_fd(),
                            ACCEPT_BACKOFF.as_millis() as i32,
                        ) {
                            return;
                        }
                        continue;
                    }
                };
                let Some(slot) = Slot::take(&active, MAX_CONNECTIONS) else {
                    refuse(stream);
                    continue;
                };
                let (c, s) = (control.clone(), shutdown.clone());
                let _ = std::thread::Builder::new()
                    .name("blklab-control-conn".into())
                    .spawn(move || {
                        let _slot = slot;
                        serve_connection(stream, &c, &s)
                    });
            }
        })
}

/// Answer a connection over the cap with an error and close it, without
/// ever blocking the accept thread.
fn refuse(stream: UnixStream) {
    // A local client can open connections at will: a line per 10 s at most.
    static REFUSED: LogLimit = LogLimit::new(Duration::from_secs(10));
    if let Some(held) = REFUSED.event() {
        warn!(
            "control socket: more than {MAX_CONNECTIONS} connections; refusing one{}",
            LogLimit::held_note(held)
        );
    }
    let _ = stream.set_nonblocking(true);
    let answer = json!({
        "error": format!("too many control connections (at most {MAX_CONNECTIONS}); try again later")
    });
    let _ = (&stream).write_all(format!("{answer}\n").as_bytes());
}

/// What reading one request line gave.
enum Line {
    /// A complete line (without its newline), or the last bytes before EOF.
    Complete(Vec<u8>),
    /// The peer closed (nothing pending), shutdown began, or a read failed.
    Closed,
    /// No complete line within [`IDLE_TIMEOUT`].
    Idle,
    /// More than [`MAX_LINE`] bytes without a newline; the first bytes.
    TooLong(Vec<u8>),
}

/// Read one line of at most [`MAX_LINE`] bytes within [`IDLE_TIMEOUT`],
/// waking every 500 ms to notice `shutdown`.
fn read_request(reader: &mut BufReader<UnixStream>, shutdown: &AtomicBool) -> Line {
    let deadline = Instant::now() + IDLE_TIMEOUT;
    let mut buf = Vec::new();
    loop {
        if shutdown.load(Ordering::SeqCst) {
            return Line::Closed;
        }
        if Instant::now() >= deadline {
            return Line::Idle;
        }
        // One read at a time (not read_until, which keeps reading while
        // bytes trickle in), so the deadline is checked between reads.
        let chunk = match reader.fill_buf() {
            Ok([]) if buf.is_empty() => return Line::Closed,
            // EOF after a last line without a newline: answer it.
            Ok([]) => return Line::Complete(buf),
            Ok(chunk) => chunk,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => {
                static BROKEN: LogLimit = LogLimit::new(Duration::from_secs(10));
                if let Some(held) = BROKEN.event() {
                    warn!("control connection: {e}{}", LogLimit::held_note(held));
                }
                return Line::Closed;
            }
        };
        let room = MAX_LINE - buf.len();
        match chunk.iter().position(|&b| b == b'\n') {
            Some(nl) if nl <= room => {
                buf.extend_from_slice(&chunk[..nl]);
                reader.consume(nl + 1);
                return Line::Complete(buf);
            }
            _ if chunk.len() > room => {
                buf.extend_from_slice(&chunk[..room]);
                buf.truncate(QUOTE_PREFIX * 4);
                return Line::TooLong(buf);
            }
            _ => {
                let n = chunk.len();
                buf.extend_from_slice(chunk);
                reader.consume(n);
            }
        }
    }
}

fn serve_connection(stream: UnixStream, control: &Control, shutdown: &AtomicBool) {
    // Wake up now and then to notice shutdown and the idle deadline; a
    // client that does not take its answer is dropped.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = stream.set_write_timeout(Some(IDLE_TIMEOUT));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let answer = match read_request(&mut reader, shutdown) {
            Line::Complete(line) => control.answer(&String::from_utf8_lossy(&line)),
            Line::Closed => return,
            Line::Idle => {
                let _ = writeln!(
                    out,
                    "{}",
                    json!({"error": format!("no complete request within {} s; closing", IDLE_TIMEOUT.as_secs())})
                );
                return;
            }
            Line::TooLong(prefix) => {
                let prefix = String::from_utf8_lossy(&prefix);
                let _ = writeln!(
                    out,
                    "{}",
                    json!({"error": format!("request line longer than {MAX_LINE} bytes (starts {}); closing", quote_prefix(&prefix))})
                );
                return;
            }
        };
        if writeln!(out, "{answer}").is_err() {
            return;
        }
    }
}

/// Ask a running daemon one question.
pub fn query(path: &Path, command: &str) -> std::io::Result<Value> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    writeln!(s, "{command}")?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Ask a running daemon for a stats document (`stats` or `snapshot
/// LABEL`), typed: an `{"error": …}` answer, a document that is not a
/// stats document or one of another major schema version is an error.
pub fn query_stats(path: &Path, command: &str) -> std::io::Result<StatsDocument> {
    stats_answer(&query(path, command)?, command)
}

/// The stats document in a daemon's answer to `command` (see
/// [`query_stats`]).
pub fn stats_answer(answer: &Value, command: &str) -> std::io::Result<StatsDocument> {
    if let Some(err) = answer.get("error") {
        let err = err.as_str().map_or_else(|| err.to_string(), str::to_string);
        return Err(std::io::Error::other(format!("the daemon answered: {err}")));
    }
    StatsDocument::deserialize(answer).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the answer to {command:?} is not a stats document: {e}"),
        )
    })
}

/// Write `daemon`'s final statistics document to `path`.
pub(crate) fn write_stats_file(
    path: &Path,
    daemon: &DaemonIdentity,
    disks: &[Arc<Disk>],
) -> std::io::Result<()> {
    let doc = report(daemon, disks, None);
    let text = serde_json::to_string_pretty(&doc).map_err(std::io::Error::other)?;
    std::fs::write(path, text + "\n")?;
    info!("wrote statistics to {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        assert_eq!(parse_command("stats\n"), ("stats".into(), None));
        assert_eq!(
            parse_command("snapshot warm up"),
            ("snapshot".into(), Some("warm up".into()))
        );
        assert_eq!(
            parse_command(r#"{"cmd":"snapshot","label":"a"}"#),
            ("snapshot".into(), Some("a".into()))
        );
        assert_eq!(parse_command("{bad").0, "invalid-json");
    }

    #[test]
    fn quotes_are_short() {
        assert_eq!(quote_prefix("abc"), "\"abc\"");
        let long = "x".repeat(10_000);
        let q = quote_prefix(&long);
        assert!(q.len() < 80, "{q}");
        assert!(q.ends_with('…'));
        // Cut on a character boundary.
        let q = quote_prefix(&"é".repeat(100));
        assert!(q.ends_with('…'));
    }
}
