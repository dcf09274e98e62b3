//! `blklab stats`: read a running daemon's statistics through its control
//! socket and show them as a per-queue table (in the spirit of `iostat -x`)
//! or as the JSON document.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::time::Instant;

use serde_json::Value;

use crate::backend::control::query;
use crate::cli::{StatsArgs, StatsFormat};

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(next) => cur = next,
            None => return 0.0,
        }
    }
    cur.as_f64().unwrap_or(0.0)
}

/// Render a stats document; `prev` (with the seconds since it) adds rates.
pub fn table(doc: &Value, prev: Option<(&Value, f64)>) -> String {
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
    let mut before: HashMap<(String, u64), f64> = HashMap::new();
    if let Some((p, _)) = prev {
        for d in p["disks"].as_array().into_iter().flatten() {
            let sock = d["config"]["socket"].as_str().unwrap_or("").to_string();
            for q in d["queues"].as_array().into_iter().flatten() {
                before.insert(
                    (sock.clone(), num(q, &["index"]) as u64),
                    num(q, &["counters", "requests"]),
                );
            }
        }
    }
    for d in doc["disks"].as_array().into_iter().flatten() {
        let sock = d["config"]["socket"].as_str().unwrap_or("?").to_string();
        for q in d["queues"].as_array().into_iter().flatten() {
            let idx = num(q, &["index"]) as u64;
            let req = num(q, &["counters", "requests"]);
            let kicks = num(q, &["counters", "kicks"]);
            let iops = match prev {
                Some((_, secs)) if secs > 0.0 => {
                    let b = before.get(&(sock.clone(), idx)).copied().unwrap_or(0.0);
                    format!("{:.0}", (req - b).max(0.0) / secs)
                }
                _ => "-".into(),
            };
            let errors = num(q, &["counters", "status_ioerr"])
                + num(q, &["counters", "status_unsupp"])
                + num(q, &["counters", "dropped"]);
            let cpu = num(q, &["worker_cpu", "user_s"]) + num(q, &["worker_cpu", "sys_s"]);
            let per_kick = if kicks > 0.0 {
                format!("{:.2}", req / kicks)
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
                idx,
                req as u64,
                iops,
                kicks as u64,
                per_kick,
                errors as u64,
                num(q, &["counters", "notifications"]) as u64,
                num(q, &["latency_read_ns", "p50"]) / 1000.0,
                num(q, &["latency_read_ns", "p99"]) / 1000.0,
                num(q, &["latency_write_ns", "p99"]) / 1000.0,
                cpu
            );
            let (spin, hits, misses) = (
                num(q, &["counters", "poll_spin_ns"]),
                num(q, &["counters", "poll_hits"]),
                num(q, &["counters", "poll_misses"]),
            );
            if hits + misses > 0.0 {
                let _ = writeln!(
                    out,
                    "{:<28} {:>3} poll: spin {:.3} s, {} hits, {} misses",
                    "",
                    idx,
                    spin / 1e9,
                    hits as u64,
                    misses as u64
                );
            }
        }
    }
    out
}

/// Run `blklab stats`.
pub fn run(args: &StatsArgs) -> io::Result<()> {
    let mut prev: Option<(Value, Instant)> = None;
    loop {
        let command = if args.format == StatsFormat::Prom {
            "prom"
        } else {
            "stats"
        };
        let doc = query(&args.control, command).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot query {}: {e}", args.control.display()),
            )
        })?;
        if let Some(err) = doc.get("error") {
            return Err(io::Error::other(format!("daemon answered: {err}")));
        }
        let now = Instant::now();
        match args.format {
            StatsFormat::Json => println!("{doc}"),
            StatsFormat::Prom => print!("{}", doc["prometheus"].as_str().unwrap_or("")),
            StatsFormat::Table => {
                let p = prev
                    .as_ref()
                    .map(|(v, t)| (v, now.duration_since(*t).as_secs_f64()));
                print!("{}", table(&doc, p));
                if args.watch.is_some() {
                    println!();
                }
            }
        }
        let Some(interval) = args.watch else {
            return Ok(());
        };
        prev = Some((doc, now));
        std::thread::sleep(interval);
    }
}
