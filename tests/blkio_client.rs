//! The daemon against a real third-party vhost-user frontend: libblkio's
//! virtio-blk-vhost-user driver (the `blkio` crate), over real sockets.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::Command;

use common::client::{Client, Op};
use common::{blklab_bin, Daemon};
use rand::{Rng, SeedableRng};

const MB: u64 = 1 << 20;

/// Every queue, from its own thread, writes random 4 KiB blocks at QD16
/// into its own region with a per-block pattern, then reads them all back.
fn concurrent_verify(client: &mut Client, region_per_queue: u64, seed: u64) {
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (qi, q) in client.queues.iter_mut().enumerate() {
            handles.push(s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed + qi as u64);
                let base = qi as u64 * region_per_queue;
                let blocks = region_per_queue / 4096;
                let mut written = std::collections::HashMap::new();
                for _round in 0..8 {
                    // 16 distinct random blocks per batch: queue depth 16.
                    let mut picks = std::collections::HashSet::new();
                    while picks.len() < 16 {
                        picks.insert(rng.gen_range(0..blocks));
                    }
                    let reqs: Vec<(Op, u64)> = picks
                        .iter()
                        .map(|b| {
                            let fill = rng.gen_range(1..=255u8);
                            written.insert(*b, fill);
                            (Op::Write(fill), base + b * 4096)
                        })
                        .collect();
                    for (ret, _) in q.batch(&reqs, 4096) {
                        assert_eq!(ret, 0, "write failed on queue {qi}");
                    }
                }
                let all: Vec<(u64, u8)> = written.into_iter().collect();
                for chunk in all.chunks(16) {
                    let reqs: Vec<(Op, u64)> = chunk
                        .iter()
                        .map(|(b, _)| (Op::Read, base + b * 4096))
                        .collect();
                    for ((ret, data), (b, fill)) in q.batch(&reqs, 4096).into_iter().zip(chunk) {
                        assert_eq!(ret, 0, "read failed on queue {qi}");
                        assert!(
                            data.iter().all(|x| x == fill),
                            "queue {qi} block {b}: data mismatch"
                        );
                    }
                }
                all.len()
            }));
        }
        for h in handles {
            let n = h.join().expect("queue thread");
            assert!(n >= 16);
        }
    });
}

#[test]
fn mem_disk_concurrent_writes_every_queue() {
    let d = Daemon::spawn(
        &[
            "--disk",
            "mem",
            "--size",
            "64M",
            "--num-queues",
            "4",
            "--queue-size",
            "128",
        ],
        1,
    );
    let mut c = Client::connect(&d.socket, 4).expect("connect");
    assert_eq!(c.capacity(), 64 * MB);
    assert_eq!(c.queues.len(), 4);
    concurrent_verify(&mut c, 16 * MB, 1);
}

#[test]
fn file_disk_concurrent_writes_and_image_contents() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.raw");
    std::fs::write(&img, vec![0u8; (32 * MB) as usize]).unwrap();
    let spec = format!("file:{}", img.display());
    let mut d = Daemon::spawn(&["--disk", &spec, "--num-queues", "2"], 1);
    let mut c = Client::connect(&d.socket, 2).expect("connect");
    assert_eq!(c.capacity(), 32 * MB, "size taken from the image");
    concurrent_verify(&mut c, 16 * MB, 7);
    // A known block, then check the image file itself.
    assert_eq!(c.queues[0].write(4096 * 3, &[0x42; 4096]), 0);
    assert_eq!(c.queues[0].flush(), 0);
    drop(c);
    assert!(d.terminate().success());
    let bytes = std::fs::read(&img).unwrap();
    assert!(bytes[4096 * 3..4096 * 4].iter().all(|x| *x == 0x42));
}

#[test]
fn flush_discard_write_zeroes() {
    let d = Daemon::spawn(&["--disk", "mem", "--size", "16M"], 1);
    let mut c = Client::connect(&d.socket, 1).expect("connect");
    let q = &mut c.queues[0];
    assert_eq!(q.write(0, &vec![0x5a; 65536]), 0);
    assert_eq!(q.flush(), 0);
    // Discard the middle 16 KiB: reads back zeros, neighbours intact.
    assert_eq!(q.discard(16384, 16384), 0);
    let (r, data) = q.read(0, 65536);
    assert_eq!(r, 0);
    assert!(data[..16384].iter().all(|x| *x == 0x5a));
    assert!(data[16384..32768].iter().all(|x| *x == 0));
    assert!(data[32768..].iter().all(|x| *x == 0x5a));
    // Write-zeroes with and without unmap.
    assert_eq!(q.write_zeroes(32768, 4096, false), 0);
    assert_eq!(q.write_zeroes(36864, 12288, true), 0);
    let (_, data) = q.read(0, 65536);
    assert!(data[32768..49152].iter().all(|x| *x == 0));
    assert!(data[49152..].iter().all(|x| *x == 0x5a));
    // Out of range: an error, and the disk keeps serving.
    let cap = c.capacity();
    let q = &mut c.queues[0];
    assert_ne!(q.read(cap, 4096).0, 0);
    assert_eq!(q.read(0, 4096).0, 0);
}

#[test]
fn file_disk_discard_punches_holes() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.raw");
    let spec = format!("file:{}", img.display());
    let d = Daemon::spawn(&["--disk", &spec, "--size", "8M"], 1);
    let mut c = Client::connect(&d.socket, 1).expect("connect");
    let q = &mut c.queues[0];
    assert_eq!(q.write(0, &vec![0x33; 1 << 20]), 0);
    assert_eq!(q.flush(), 0);
    let before = std::fs::metadata(&img).unwrap();
    assert_eq!(q.discard(0, 1 << 20), 0);
    let (_, data) = q.read(0, 1 << 20);
    assert!(data.iter().all(|x| *x == 0));
    use std::os::unix::fs::MetadataExt;
    let after = std::fs::metadata(&img).unwrap();
    assert!(
        after.blocks() < before.blocks(),
        "discard punched a hole: {} -> {} blocks",
        before.blocks(),
        after.blocks()
    );
}

#[test]
fn read_only_disk_refuses_writes() {
    let d = Daemon::spawn(&["--disk", "mem", "--size", "16M", "--read-only"], 1);
    // libblkio sees VIRTIO_BLK_F_RO and refuses a read-write open.
    let err = Client::connect(&d.socket, 1)
        .err()
        .expect("read-write open of a read-only disk");
    assert!(err.to_string().contains("read-only"), "{err}");
    let mut c = Client::connect_read_only(&d.socket, 1).expect("connect");
    assert!(c.read_only());
    let q = &mut c.queues[0];
    assert_eq!(q.read(0, 4096).0, 0);
    // libblkio refuses writes to a read-only device itself; the daemon
    // refuses them too (tested at the descriptor level in raw_frontend).
    assert_ne!(q.write(0, &[1; 4096]), 0);
}

#[test]
fn reconnect_twenty_times_data_intact() {
    let mut d = Daemon::spawn(&["--disk", "mem", "--size", "16M", "--num-queues", "2"], 1);
    for i in 0..20u64 {
        let mut c = Client::connect(&d.socket, 2).unwrap_or_else(|e| panic!("connect #{i}: {e}"));
        let q = (i % 2) as usize;
        // Everything written by earlier connections is still there.
        for j in 0..i {
            let (r, data) = c.queues[q].read(j * 4096, 4096);
            assert_eq!(r, 0);
            assert!(
                data.iter().all(|x| *x == j as u8 + 1),
                "connection {i}: block {j} lost"
            );
        }
        assert_eq!(c.queues[q].write(i * 4096, &[i as u8 + 1; 4096]), 0);
        drop(c);
    }
    assert!(d.alive());
    assert!(d.terminate().success());
}

#[test]
fn count_three_disks_each_verified() {
    let d = Daemon::spawn(
        &[
            "--disk",
            "mem",
            "--size",
            "8M",
            "--count",
            "3",
            "--num-queues",
            "2",
        ],
        3,
    );
    let mut clients: Vec<Client> = (0..3)
        .map(|i| Client::connect(&d.socket_n(i), 2).expect("connect"))
        .collect();
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(c.capacity(), 8 * MB);
        for q in 0..2 {
            assert_eq!(
                c.queues[q].write((q as u64) * MB, &[(10 * i + q) as u8 + 1; 8192]),
                0
            );
        }
    }
    // Each disk holds only its own data.
    for (i, c) in clients.iter_mut().enumerate() {
        for q in 0..2 {
            let (r, data) = c.queues[q].read((q as u64) * MB, 8192);
            assert_eq!(r, 0);
            assert!(
                data.iter().all(|x| *x == (10 * i + q) as u8 + 1),
                "disk {i} queue {q}"
            );
        }
    }
}

#[test]
fn sigterm_removes_socket_and_mode_is_0600() {
    let mut d = Daemon::spawn(&["--disk", "null", "--size", "1G"], 1);
    let meta = std::fs::metadata(&d.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Serving while connected: SIGTERM still ends it cleanly.
    let mut c = Client::connect(&d.socket, 1).expect("connect");
    assert_eq!(c.queues[0].read(0, 4096), (0, vec![0; 4096]));
    let st = d.terminate();
    assert!(st.success(), "exit status {st}");
    assert!(!d.socket.exists(), "socket removed on exit");
    drop(c);
}

#[test]
fn socket_mode_option() {
    let d = Daemon::spawn(
        &["--disk", "null", "--size", "1G", "--socket-mode", "0660"],
        1,
    );
    assert_eq!(
        std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777,
        0o660
    );
}

#[test]
fn refuses_live_socket_and_non_socket_but_replaces_stale() {
    let d = Daemon::spawn(&["--disk", "null", "--size", "1G"], 1);
    // A second daemon on the live socket is refused.
    let out = Command::new(blklab_bin())
        .args(["serve", "--disk", "null", "--size", "1G", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already exists and a process is listening"),
        "{err}"
    );

    // A regular file at the path is refused and left alone.
    let f = d.path().join("notasocket");
    std::fs::write(&f, b"keep me").unwrap();
    let out = Command::new(blklab_bin())
        .args(["serve", "--disk", "null", "--size", "1G", "--socket"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));
    assert_eq!(std::fs::read(&f).unwrap(), b"keep me");

    // A stale socket (nobody listening) is replaced.
    let stale = d.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let dir2 = tempfile::tempdir().unwrap();
    let d2 = Daemon::spawn_at(dir2, stale.clone(), &["--disk", "null", "--size", "1G"], 1);
    let mut c = Client::connect(&d2.socket, 1).expect("connect to the replaced socket");
    assert_eq!(c.queues[0].read(0, 512).0, 0);
}

#[test]
fn image_lock_keeps_a_second_daemon_away() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.raw");
    let spec = format!("file:{}", img.display());
    let _d = Daemon::spawn(&["--disk", &spec, "--size", "8M"], 1);
    let out = Command::new(blklab_bin())
        .args(["serve", "--disk", &spec, "--socket"])
        .arg(dir.path().join("other.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another process"), "{err}");
}

#[test]
fn bad_cli_values_give_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["--disk", "mem", "--size", "4Q"], "invalid --size"),
        (&["--disk", "nvme", "--size", "4G"], "invalid --disk"),
        (&["--disk", "mem"], "--size is required"),
        (
            &["--disk", "mem", "--size", "1G", "--num-queues", "0"],
            "--num-queues",
        ),
        (
            &["--disk", "mem", "--size", "1G", "--queue-size", "100"],
            "--queue-size",
        ),
        (
            &["--disk", "file:/nonexistent/dir/x.raw"],
            "cannot open image",
        ),
        (
            &[
                "--disk",
                "mem",
                "--size",
                "1G",
                "--disable-features",
                "warp-drive",
            ],
            "unknown feature",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (args, want) in cases {
        let out = Command::new(blklab_bin())
            .arg("serve")
            .arg("--socket")
            .arg(dir.path().join("x.sock"))
            .args(*args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: expected {want:?} in {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(
            err.matches(want).count(),
            1,
            "{args:?}: message repeated: {err}"
        );
    }
}

#[test]
fn config_file_serves_different_disks() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.sock");
    let b = dir.path().join("b.sock");
    let cfg = dir.path().join("disks.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[disk]]\nsocket = {:?}\ndisk = \"mem\"\nsize = \"8M\"\nnum-queues = 2\n\n[[disk]]\nsocket = {:?}\ndisk = \"null\"\nsize = \"1G\"\nread-only = true\n",
            a.display().to_string(),
            b.display().to_string()
        ),
    )
    .unwrap();
    let mut child = KillOnDrop(
        Command::new(blklab_bin())
            .args(["serve", "--config"])
            .arg(&cfg)
            .spawn()
            .unwrap(),
    );
    common::wait_until("both sockets of the config file", || {
        a.exists() && b.exists()
    });
    let ca = Client::connect(&a, 2).expect("connect a");
    assert_eq!(ca.capacity(), 8 * MB);
    let cb = Client::connect_read_only(&b, 1).expect("connect b");
    assert_eq!(cb.capacity(), 1 << 30);
    assert!(cb.read_only());
    drop((ca, cb));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGINT) };
    assert!(child.0.wait().unwrap().success());
    assert!(!a.exists() && !b.exists());
}

/// A child process killed when the test ends, pass or fail.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn file_disk_o_direct() {
    // /tmp may be tmpfs, which has no O_DIRECT: keep the image in the
    // target directory, which is on a real file system.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let img = dir.path().join("direct.raw");
    let spec = format!("file:{}", img.display());
    let d = Daemon::spawn(
        &[
            "--disk",
            &spec,
            "--size",
            "16M",
            "--direct",
            "--num-queues",
            "2",
        ],
        1,
    );
    let mut c = Client::connect(&d.socket, 2).expect("connect");
    concurrent_verify(&mut c, 8 * MB, 3);
    assert_eq!(c.queues[1].flush(), 0);
}

#[test]
fn without_event_idx_and_indirect_descriptors() {
    // The notification path without EVENT_IDX (flags instead of event
    // indexes) and direct descriptors only.
    let d = Daemon::spawn(
        &[
            "--disk",
            "mem",
            "--size",
            "32M",
            "--num-queues",
            "2",
            "--disable-features",
            "event-idx,indirect-desc",
        ],
        1,
    );
    let mut c = Client::connect(&d.socket, 2).expect("connect");
    concurrent_verify(&mut c, 16 * MB, 11);
}

#[test]
fn block_size_4096_and_thread_mapping() {
    // Two queues on one worker thread, 4 KiB logical blocks.
    let d = Daemon::spawn(
        &[
            "--disk",
            "mem",
            "--size",
            "32M",
            "--num-queues",
            "2",
            "--block-size",
            "4096",
            "--queues-per-thread",
            "0x3",
        ],
        1,
    );
    let mut c = Client::connect(&d.socket, 2).expect("connect");
    assert_eq!(c.blkio.get_i32("request-alignment").unwrap(), 4096);
    concurrent_verify(&mut c, 16 * MB, 5);
}

/// Busy-wait `d` (a sleep would round it up to the timer's granularity).
fn spin_for(d: std::time::Duration) {
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Wait for request `i`'s completion, for at most 10 s: a request whose
/// notification was lost would never complete.
fn wait_one(q: &mut common::client::ClientQueue, i: usize) -> i32 {
    let mut comps = [std::mem::MaybeUninit::<blkio::Completion>::uninit()];
    let mut timeout = std::time::Duration::from_secs(10);
    let n =
        q.q.do_io(&mut comps, 1, Some(&mut timeout), None)
            .expect("do_io");
    assert_eq!(
        n, 1,
        "request {i} did not complete within 10 s: a lost notification"
    );
    // SAFETY: do_io initialised the first entry.
    let c = unsafe { comps[0].assume_init_ref() };
    assert_eq!(c.user_data, i, "request {i}: another completion");
    c.ret
}

/// Adaptive polling at QD1 against a libblkio client that sleeps until
/// each completion, with a pause before each request: mostly short
/// (polling catches it once the window has grown past the client's
/// wake-up), a quarter spread over 0-400 µs, across the window as it
/// grows (so requests land just before, at and after the moment the
/// worker turns notifications back on and sleeps), and one in twenty
/// longer than the window's bound of 400 µs (the worker sleeps, the window
/// resets). Every request completes and reads back what was written, the
/// worker slept and was woken over a thousand times, and requests found
/// by polling came without a kick. (A sleeping client leaves the worker a
/// CPU to poll on a small machine; two busy-polling sides would fight for
/// it.)
fn adaptive_qd1_no_request_lost(extra: &[&str]) {
    use blkio::ReqFlags;
    use rand::Rng;
    const N: usize = 6000;
    // Request i writes 512-byte block i % BLOCKS from its own slot of the
    // buffers, filled beforehand, so the pauses are the client's only work.
    const BLOCKS: usize = 2048;
    let mut args = vec![
        "--disk",
        "mem",
        "--size",
        "16M",
        "--num-queues",
        "1",
        "--poll=adaptive:400us",
    ];
    args.extend_from_slice(extra);
    let d = Daemon::with_control(&args, 1);
    let mut c = Client::connect(&d.socket, 1).expect("connect");
    let q = &mut c.queues[0];
    let fill = |b: usize| (b % 251) as u8 + 1;
    for b in 0..BLOCKS {
        q.buf()[b * 512..(b + 1) * 512].fill(fill(b));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(27);
    for i in 0..N {
        let pause = match rng.gen_range(0..20) {
            0..=13 => rng.gen_range(0..3_000),
            14..=18 => rng.gen_range(0..400_000),
            _ => rng.gen_range(500_000..700_000),
        };
        spin_for(std::time::Duration::from_nanos(pause));
        let b = i % BLOCKS;
        let ptr = q.ptr(b * 512, 512);
        q.q.write(b as u64 * 512, ptr, 512, i, ReqFlags::empty());
        assert_eq!(wait_one(q, i), 0, "request {i} failed");
    }
    // Every block holds what its last write wrote.
    q.buf().fill(0);
    for b in 0..BLOCKS {
        let ptr = q.ptr(b * 512, 512);
        q.q.read(b as u64 * 512, ptr, 512, b, ReqFlags::empty());
        assert_eq!(wait_one(q, b), 0, "read of block {b} failed");
    }
    for b in 0..BLOCKS {
        assert!(
            q.buf()[b * 512..(b + 1) * 512]
                .iter()
                .all(|x| *x == fill(b)),
            "block {b}: data"
        );
    }
    let total = (N + BLOCKS) as u64;
    let doc = common::wait_for_counters(d.control(), 0, 0, &[("requests", total)]);
    let qs = &doc["disks"][0]["queues"][0];
    let n = |k: &str| qs["counters"][k].as_u64().unwrap();
    let (requests, kicks, misses) = (n("requests"), n("kicks"), n("poll_misses"));
    let report = format!("{extra:?}: {}", qs["counters"]);
    assert_eq!(requests, total, "{report}");
    // The worker went to sleep with notifications on, and was woken,
    // over a thousand times.
    assert!(misses >= 1000, "{report}");
    // Requests came without a kick while the worker polled: caught by idle
    // polling (`poll_hits`) or by the pass that completed the one before
    // (the client answers while that pass is still going). How many
    // depends on how busy the machine is (about half here); the bound is
    // loose.
    assert!(kicks <= requests * 9 / 10, "{report}");
    // The window adapted both ways and was recorded.
    assert!(
        n("poll_window_grows") > 0 && n("poll_window_shrinks") > 0,
        "{report}"
    );
    assert!(
        qs["poll_window_ns"]["count"].as_u64().unwrap() > 0,
        "{}",
        qs
    );
}

/// Both notification schemes, one after the other (two polling workers at
/// once would take both CPUs of a small machine).
#[test]
fn adaptive_polling_loses_no_request_with_and_without_event_idx() {
    adaptive_qd1_no_request_lost(&[]);
    adaptive_qd1_no_request_lost(&["--disable-features", "event-idx"]);
}
