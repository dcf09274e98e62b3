//! The control socket's limits, against the real daemon on a real Unix
//! socket: the line-length cap (a short error, the connection closed, the
//! daemon unharmed), the connection cap, the idle timeout, and an
//! `accept` that fails with EMFILE backing off instead of spinning.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use blklab::backend::control::{IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_LINE};
use common::{wait_for, Daemon, PATIENCE};
use serde_json::Value;

fn daemon() -> Daemon {
    Daemon::with_control(&["--disk", "mem", "--size", "1M"], 1)
}

fn connect(ctl: &Path) -> UnixStream {
    let s = UnixStream::connect(ctl).expect("connect to the control socket");
    // Generous: a loaded machine may be slow; a daemon that never answers
    // still fails the test.
    s.set_read_timeout(Some(IDLE_TIMEOUT + PATIENCE)).unwrap();
    s
}

/// The next answer line on `r`, parsed; `None` at EOF.
fn answer(r: &mut BufReader<UnixStream>) -> Option<Value> {
    let mut line = String::new();
    let n = match r.read_line(&mut line) {
        // Closed with our unread bytes still queued: a reset, also a close.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
        other => other.expect("read an answer"),
    };
    (n > 0).then(|| serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
}

/// Open every control slot with a served connection (each holds its
/// slot while open).
fn fill_slots(d: &Daemon) -> Vec<BufReader<UnixStream>> {
    (0..MAX_CONNECTIONS)
        .map(|_| {
            let mut s = connect(d.control());
            writeln!(s, "config").unwrap();
            let mut r = BufReader::new(s);
            assert!(answer(&mut r).unwrap().get("disks").is_some());
            r
        })
        .collect()
}

fn error_of(v: &Value) -> String {
    v.get("error")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not an error: {v}"))
        .to_string()
}

#[test]
fn an_overlong_line_is_refused_with_a_short_error() {
    let d = daemon();
    let s = connect(d.control());
    let mut w = s.try_clone().unwrap();
    // 4 MiB without a newline, from another thread (the daemon stops
    // reading after MAX_LINE bytes, so the writer ends with EPIPE).
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..64 {
            if w.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("an answer");
    assert!(
        line.len() < 400,
        "the error echoes too much: {} bytes",
        line.len()
    );
    let v: Value = serde_json::from_str(&line).unwrap();
    let e = error_of(&v);
    assert!(e.contains(&format!("longer than {MAX_LINE} bytes")), "{e}");
    assert!(e.contains("xxxx"), "quotes a prefix: {e}");
    assert!(answer(&mut r).is_none(), "the connection is closed");
    writer.join().unwrap();
    // A line of exactly the cap's order still works, and so does the daemon.
    assert!(d.query("stats").get("disks").is_some());
    // An unknown command is quoted short too.
    let v = d.query(&"y".repeat(MAX_LINE / 2));
    let e = error_of(&v);
    assert!(e.len() < 200, "{e}");
}

#[test]
fn connections_beyond_the_cap_are_refused_and_slots_come_back() {
    let d = daemon();
    // Fill every slot; each connection is served (so it holds a slot).
    let mut held = fill_slots(&d);
    // One more: an error, then EOF.
    let mut r = BufReader::new(connect(d.control()));
    let e = error_of(&answer(&mut r).expect("an answer"));
    assert!(e.contains("too many control connections"), "{e}");
    assert!(answer(&mut r).is_none());
    // Close one; its slot comes back (once its thread has seen the EOF).
    drop(held.pop());
    let v = wait_for("a free control slot", PATIENCE, || {
        let v = blklab::backend::control::query(d.control(), "config").ok()?;
        v.get("disks").is_some().then_some(v)
    });
    assert!(v.get("blklab_version").is_some());
    drop(held);
}

/// A local client that opens connection after connection over the cap
/// cannot grow the daemon's log: every one is refused, and the refusals
/// take one log line per 10 s, not one each.
#[test]
fn refused_connections_do_not_flood_the_log() {
    let (d, log) = Daemon::with_control_logged(&["--disk", "mem", "--size", "1M"]);
    let held = fill_slots(&d);
    const OVER: usize = 300;
    for i in 0..OVER {
        let mut r = BufReader::new(connect(d.control()));
        let e = error_of(&answer(&mut r).unwrap_or_else(|| panic!("connection {i}: no answer")));
        assert!(e.contains("too many control connections"), "{e}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let refusals = text.lines().filter(|l| l.contains("refusing one")).count();
    assert!(
        (1..=2).contains(&refusals),
        "{OVER} refused connections took {refusals} log lines:\n{text}"
    );
    drop(held);
    // Still serving, once a connection thread has seen its EOF and given
    // its slot back.
    wait_for("a free control slot after the refusals", PATIENCE, || {
        let v = blklab::backend::control::query(d.control(), "stats").ok()?;
        v.get("disks").is_some().then_some(v)
    });
}

/// A silent connection and one that trickles a line it never finishes are
/// both closed after [`IDLE_TIMEOUT`]. The two are opened together and
/// wait out the same timeout side by side.
#[test]
fn an_idle_connection_is_closed() {
    let d = daemon();
    // Nothing sent: after IDLE_TIMEOUT the daemon says so and closes.
    let mut silent = BufReader::new(connect(d.control()));
    // A trickled, never-finished line is no better than silence.
    let mut s = connect(d.control());
    let mut trickled = BufReader::new(s.try_clone().unwrap());
    let trickle = std::thread::spawn(move || {
        for _ in 0..(IDLE_TIMEOUT.as_secs() * 4 + PATIENCE.as_secs()) {
            if s.write_all(b"s").is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        false
    });
    let silent_closed = std::thread::spawn(move || {
        let e = error_of(&answer(&mut silent).expect("an answer before the close"));
        assert!(e.contains("no complete request"), "{e}");
        assert!(answer(&mut silent).is_none());
    });
    let e = error_of(&answer(&mut trickled).expect("an answer before the close"));
    assert!(e.contains("no complete request"), "{e}");
    assert!(trickle.join().unwrap(), "the daemon closed the connection");
    silent_closed
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

/// Utime + stime (clock ticks) of the daemon's control thread.
fn control_thread_ticks(pid: i32) -> Option<u64> {
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if comm.trim() == "blklab-control" {
            let stat = std::fs::read_to_string(t.join("stat")).unwrap();
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            let f: Vec<&str> = rest.split(' ').collect();
            // Fields 14 and 15 of stat(5), counted after "pid (comm) ".
            return Some(f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap());
        }
    }
    None
}

fn set_nofile(pid: i32, soft: u64) {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit reads `new` and writes `old`, both valid for the call.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let new = libc::rlimit {
        rlim_cur: soft,
        rlim_max: old.rlim_max,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn accept_failing_with_emfile_backs_off() {
    let d = daemon();
    let pid = d.pid();
    // The control thread starts just after its socket appears.
    wait_for("the control thread", PATIENCE, || control_thread_ticks(pid));
    // No new descriptor may be numbered 3 or more: the next accept fails
    // with EMFILE (the daemon's other threads open nothing meanwhile).
    set_nofile(pid, 3);
    let mut pending = connect(d.control());
    writeln!(pending, "config").unwrap();
    // The connection stays queued while accept fails. Over a few seconds
    // a spinning accept loop burns (nearly) all of them; one that backs
    // off uses a few milliseconds. The margin is wide both ways: 0.5 s of
    // CPU in 5 s of wall time.
    let ticks = // SAFETY: sysconf has no memory effects.
        unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let before = control_thread_ticks(pid).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let used = control_thread_ticks(pid).unwrap() - before;
    assert!(
        used < ticks / 2,
        "the control thread used {used} ticks ({ticks}/s) in 5 s while accept failed"
    );
    // With the limit back, the queued connection is served.
    set_nofile(pid, 1024);
    let mut r = BufReader::new(pending);
    assert!(answer(&mut r).unwrap().get("disks").is_some());
}
