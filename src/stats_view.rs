//! `blklab stats`: read a running daemon's statistics through its control
//! socket and show them as a per-queue table (in the spirit of `iostat -x`)
//! or as the JSON document.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::time::Instant;

use crate::backend::control::{query, query_stats, stats_answer};
use crate::cli::{StatsArgs, StatsFormat};
use crate::stats::queue::StatsDocument;

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
                let p = prev
                    .as_ref()
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
