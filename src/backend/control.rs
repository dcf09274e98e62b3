//! The control socket: JSON lines over a Unix socket, to read statistics
//! while the daemon runs.
//!
//! Each request is one line, either plain words or a JSON object:
//! - `stats` / `{"cmd":"stats"}`: everything since start (or the last reset);
//! - `snapshot LABEL` / `{"cmd":"snapshot","label":"LABEL"}`: the delta since
//!   the previous snapshot (or start/reset), with the wall time it covers;
//! - `reset`: zero every statistic;
//! - `config`: every disk's configuration, version and git commit;
//! - `prom`: `{"prometheus": TEXT}`, the statistics in Prometheus format.
//!
//! Each answer is one JSON line; errors are `{"error": "..."}`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{info, warn};
use serde::Deserialize;
use serde_json::{json, Value};
use vmm_sys_util::eventfd::EventFd;

use crate::backend::Disk;
use crate::stats::queue::{DiskReport, QueueStats, StatsDocument};

/// A stats document for `disks`, as deltas against `base` when given.
pub fn report(disks: &[Arc<Disk>], base: Option<&[Vec<QueueStats>]>) -> StatsDocument {
    let reports = disks
        .iter()
        .enumerate()
        .map(|(d, disk)| DiskReport {
            config: Some(disk.cfg.clone()),
            queues: (0..disk.stats.len())
                .map(|q| {
                    let st = disk.queue_stats(q);
                    st.report(q, base.and_then(|b| b.get(d)).and_then(|v| v.get(q)))
                })
                .collect(),
            tag_pools: disk.tag_pool_stats(),
        })
        .collect();
    StatsDocument::new(reports)
}

/// Baselines of every queue of every disk, for later deltas.
pub(crate) fn baselines(disks: &[Arc<Disk>]) -> Vec<Vec<QueueStats>> {
    disks
        .iter()
        .map(|disk| {
            (0..disk.stats.len())
                .map(|q| disk.queue_stats(q).baseline())
                .collect()
        })
        .collect()
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
    disks: Vec<Arc<Disk>>,
    /// Baseline of the next snapshot and when it was taken.
    snapshot: Mutex<(Instant, Vec<Vec<QueueStats>>)>,
}

impl Control {
    fn answer(&self, line: &str) -> Value {
        let (cmd, label) = parse_command(line);
        match cmd.as_str() {
            "stats" => to_value(&report(&self.disks, None)),
            "snapshot" => {
                let mut snap = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
                let mut doc = report(&self.disks, Some(&snap.1));
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
                json!({"prometheus": crate::stats::prometheus::render(&report(&self.disks, None))})
            }
            "config" => {
                let doc = StatsDocument::new(Vec::new());
                json!({
                    "blklab_version": doc.blklab_version,
                    "git_commit": doc.git_commit,
                    "disks": self.disks.iter().map(|d| d.cfg.clone()).collect::<Vec<_>>(),
                })
            }
            "" => {
                json!({"error": "empty command; use stats, snapshot LABEL, reset, config or prom"})
            }
            other => {
                json!({"error": format!("unknown command {other:?}; use stats, snapshot LABEL, reset, config or prom")})
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
    disks: Vec<Arc<Disk>>,
    shutdown: Arc<AtomicBool>,
    wake: Arc<EventFd>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let control = Arc::new(Control {
        snapshot: Mutex::new((Instant::now(), baselines(&disks))),
        disks,
    });
    std::thread::Builder::new()
        .name("blklab-control".into())
        .spawn(move || {
            let fd = listener.as_raw_fd();
            loop {
                match crate::util::fd::listener_or_wake(fd, wake.as_raw_fd()) {
                    Ok(true) => {}
                    _ => return,
                }
                let Ok((stream, _)) = listener.accept() else {
                    continue;
                };
                let (c, s) = (control.clone(), shutdown.clone());
                let _ = std::thread::Builder::new()
                    .name("blklab-control-conn".into())
                    .spawn(move || serve_connection(stream, &c, &s));
            }
        })
}

fn serve_connection(stream: UnixStream, control: &Control, shutdown: &AtomicBool) {
    // Wake up now and then to notice shutdown.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !shutdown.load(Ordering::SeqCst) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                let answer = control.answer(&line);
                line.clear();
                if writeln!(out, "{answer}").is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                warn!("control connection: {e}");
                return;
            }
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

/// Write the final statistics document to `path`.
pub fn write_stats_file(path: &Path, disks: &[Arc<Disk>]) -> std::io::Result<()> {
    let doc = report(disks, None);
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
}
