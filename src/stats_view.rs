//! `blklab stats`: read a running daemon's statistics through its control
//! socket and show them as a per-queue table (in the spirit of `iostat -x`)
//! or as the JSON document. The table starts with the daemon it comes from
//! and each disk's connection generation; with `--watch` it says when the
//! daemon was replaced (its statistics started afresh: no rates over that
//! interval) or a disk's frontend reconnected (the statistics carry over).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::time::Instant;

use crate::backend::control::{query, query_stats, stats_answer};
use crate::cli::{StatsArgs, StatsFormat};
use crate::stats::queue::StatsDocument;

/// `secs` as a short duration: `45s`, `12m05s`, `3h02m`, `2d04h`.
fn fmt_uptime(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Whether `doc` and `prev` come from the same daemon instance (true when
/// either does not say: a daemon older than the field).
fn same_daemon(doc: &StatsDocument, prev: &StatsDocument) -> bool {
    match (&doc.daemon, &prev.daemon) {
        (Some(a), Some(b)) => a.instance == b.instance,
        _ => true,
    }
}

/// The lines above the table: the daemon (pid, instance, uptime) and each
/// disk's connection generation; with `prev`, the earlier look, what
/// changed since: the daemon replaced, or a disk's frontend reconnected.
pub(crate) fn header(doc: &StatsDocument, prev: Option<&StatsDocument>) -> String {
    let mut out = String::new();
    if let Some(d) = &doc.daemon {
        let _ = writeln!(
            out,
            "daemon pid {}, instance {}, up {}",
            d.pid,
            d.short(),
            fmt_uptime(d.uptime_s(doc.time_unix_ns()))
        );
    }
    let replaced = prev.filter(|p| !same_daemon(doc, p));
    if let (Some(p), Some(now)) = (replaced, &doc.daemon) {
        let was = p.daemon.as_ref().map_or("?", |d| d.short());
        let _ = writeln!(
            out,
            "the daemon was replaced since the last look (instance {was} -> {}): its statistics started afresh, no rates over this interval",
            now.short()
        );
    }
    for (i, d) in doc.disks.iter().enumerate() {
        let state = if d.connected {
            "connected"
        } else {
            "no frontend"
        };
        let _ = write!(
            out,
            "{}: connection {} ({state})",
            d.socket(),
            d.connections
        );
        let before = prev
            .filter(|_| replaced.is_none())
            .and_then(|p| p.disks.get(i))
            .map(|p| p.connections);
        match before {
            Some(b) if b != d.connections => {
                let _ = write!(
                    out,
                    "; reconnected since the last look (connection {b} -> {}): the device started over, the statistics carry over",
                    d.connections
                );
            }
            _ => {}
        }
        let _ = writeln!(out);
    }
    out
}

/// Render a stats document; `prev` (with the seconds since it) adds rates.
pub(crate) fn table(doc: &StatsDocument, prev: Option<(&StatsDocument, f64)>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:>3} {:>10} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "disk",
        "q",
        "requests",
        "IOPS",
        "kicks",
        "req/kick",
        "errors",
        "notifs",
        "rd p50us",
        "rd p99us",
        "wr p99us",
        "cpu s"
    );
    let mut before: HashMap<(String, usize), u64> = HashMap::new();
    if let Some((p, _)) = prev {
        for d in &p.disks {
            for q in &d.queues {
                before.insert((d.socket(), q.index), q.counters.requests);
            }
        }
    }
    for d in &doc.disks {
        let sock = d.socket();
        for q in &d.queues {
            let c = &q.counters;
            let req = c.requests;
            let iops = match prev {
                Some((_, secs)) if secs > 0.0 => {
                    let b = before.get(&(sock.clone(), q.index)).copied().unwrap_or(0);
                    format!("{:.0}", req.saturating_sub(b) as f64 / secs)
                }
                _ => "-".into(),
            };
            let errors = c.status_ioerr + c.status_unsupp + c.dropped;
            let cpu = q.worker_cpu.map_or(0.0, |w| w.user_s + w.sys_s);
            let per_kick = if c.kicks > 0 {
                format!("{:.2}", req as f64 / c.kicks as f64)
            } else {
                "-".into()
            };
            let name: String = if sock.len() > 28 {
                format!("…{}", &sock[sock.len() - 27..])
            } else {
                sock.clone()
            };
            let _ = writeln!(
                out,
                "{:<28} {:>3} {:>10} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9.1} {:>9.1} {:>9.1} {:>8.2}",
                name,
                q.index,
                req,
                iops,
                c.kicks,
                per_kick,
                errors,
                c.notifications,
                q.latency_read_ns.p50 as f64 / 1000.0,
                q.latency_read_ns.p99 as f64 / 1000.0,
                q.latency_write_ns.p99 as f64 / 1000.0,
                cpu
            );
            if c.poll_hits + c.poll_misses > 0 {
                let _ = write!(
                    out,
                    "{:<28} {:>3} poll: spin {:.3} s, {} hits, {} misses",
                    "",
                    q.index,
                    c.poll_spin_ns as f64 / 1e9,
                    c.poll_hits,
                    c.poll_misses
                );
                if q.poll_window_ns.count > 0 {
                    let _ = write!(
                        out,
                        ", window now {:.1} us (p50 {:.1}, p90 {:.1}; {} grew, {} shrank)",
                        q.poll_window_now_ns as f64 / 1e3,
                        q.poll_window_ns.p50 as f64 / 1e3,
                        q.poll_window_ns.p90 as f64 / 1e3,
                        c.poll_window_grows,
                        c.poll_window_shrinks
                    );
                }
                let _ = writeln!(out);
            }
        }
    }
    out
}

fn cannot_query(args: &StatsArgs, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("cannot query {}: {e}", args.control.display()),
    )
}

/// Run `blklab stats`.
pub fn run(args: &StatsArgs) -> io::Result<()> {
    let mut prev: Option<(StatsDocument, Instant)> = None;
    loop {
        match args.format {
            StatsFormat::Prom => {
                let answer = query(&args.control, "prom").map_err(|e| cannot_query(args, e))?;
                if let Some(err) = answer.get("error") {
                    return Err(io::Error::other(format!("daemon answered: {err}")));
                }
                print!("{}", answer["prometheus"].as_str().unwrap_or(""));
            }
            StatsFormat::Json => {
                // Read as a stats document (its schema version checked),
                // printed as the daemon wrote it, fields newer than this
                // blklab included.
                let answer = query(&args.control, "stats").map_err(|e| cannot_query(args, e))?;
                stats_answer(&answer, "stats").map_err(|e| cannot_query(args, e))?;
                println!("{answer}");
            }
            StatsFormat::Table => {
                let doc = query_stats(&args.control, "stats").map_err(|e| cannot_query(args, e))?;
                let now = Instant::now();
                print!("{}", header(&doc, prev.as_ref().map(|(v, _)| v)));
                // Rates only between two looks at the same daemon.
                let p = prev
                    .as_ref()
                    .filter(|(v, _)| same_daemon(&doc, v))
                    .map(|(v, t)| (v, now.duration_since(*t).as_secs_f64()));
                print!("{}", table(&doc, p));
                if args.watch.is_some() {
                    println!();
                }
                prev = Some((doc, now));
            }
        }
        let Some(interval) = args.watch else {
            return Ok(());
        };
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A document of daemon `instance`, started at 0, taken at `secs`,
    /// with one disk at `/s` in connection `gen`.
    fn doc(instance: &str, secs: u64, gen: u64) -> StatsDocument {
        let mut d: StatsDocument = serde_json::from_value(serde_json::json!({
            "daemon": {"pid": 42, "started_unix_ns": 0, "instance": instance},
            "disks": [{"queues": [], "connections": gen, "connected": gen > 0}],
        }))
        .unwrap();
        d.set_time_unix_ns(u128::from(secs) * 1_000_000_000);
        d
    }

    #[test]
    fn uptimes_are_short() {
        assert_eq!(fmt_uptime(45.9), "45s");
        assert_eq!(fmt_uptime(725.0), "12m05s");
        assert_eq!(fmt_uptime(3.0 * 3600.0 + 120.0), "3h02m");
        assert_eq!(fmt_uptime(2.0 * 86_400.0 + 4.0 * 3600.0), "2d04h");
    }

    #[test]
    fn the_header_names_the_daemon_and_each_connection() {
        let a = doc("0123456789abcdef0123456789abcdef", 725, 2);
        let h = header(&a, None);
        assert!(
            h.starts_with("daemon pid 42, instance 01234567, up 12m05s\n"),
            "{h}"
        );
        assert!(h.contains("?: connection 2 (connected)\n"), "{h}");
        assert!(!h.contains("since the last look"), "{h}");
        // The same daemon, the disk's frontend reconnected.
        let b = doc("0123456789abcdef0123456789abcdef", 730, 3);
        let h = header(&b, Some(&a));
        assert!(
            h.contains("reconnected since the last look (connection 2 -> 3)"),
            "{h}"
        );
        assert!(!h.contains("replaced"), "{h}");
        assert!(same_daemon(&b, &a));
        // A new daemon: said, and no reconnect claimed across it.
        let c = doc("fedcba9876543210fedcba9876543210", 3, 1);
        let h = header(&c, Some(&b));
        assert!(
            h.contains(
                "the daemon was replaced since the last look (instance 01234567 -> fedcba98)"
            ),
            "{h}"
        );
        assert!(!h.contains("reconnected"), "{h}");
        assert!(!same_daemon(&c, &b));
        // A daemon older than the identity: no daemon line, taken as the same.
        let old = StatsDocument::from_json(r#"{"disks": []}"#).unwrap();
        assert_eq!(header(&old, None), "");
        assert!(same_daemon(&old, &c));
    }
}
