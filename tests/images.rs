//! `images/prepare.sh` for real: the self-built guest kernels (Debian's
//! linux-source-6.12 with `images/kernel/guest.config`, with and without
//! `images/patches/noplug.patch`, and Debian 11's linux-source-5.10 from
//! bullseye-security, which `.ci/install-deps` adds), the small fio, mpstat
//! and one initramfs per kernel, then the same call again as a cache hit,
//! and the errors for bad SPECs. Each self-built kernel then boots under
//! `blklab run` and runs the `smoke` scenario, on the TSC clocksource. The
//! nested mode's host image (`images/build-nested-host.sh`): its offline
//! key, its contents, `images list`, export and import.
//!
//! Uses the image cache of `tests/qemu_e2e.rs`:
//! `${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images`, `BLKLAB_IMAGE_CACHE`
//! overrides it. The first run on a machine builds the kernels (about 10
//! minutes for 6.12 and 3–4 for 5.10 on 2 cores) and fio; later runs are
//! cache hits. Needs apt (Debian
//! 12) and the build packages `.ci/install-deps` installs; when anything is
//! missing the test fails with prepare.sh's `prepare: ERROR: …` line, it
//! never skips.
//!
//! Run: `cargo test --test images -- --nocapture`

mod common;

use common::scenario_checks::check_variant;
use common::{read_json, root};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The boots share two CPUs: one guest at a time.
static BOOT: Mutex<()> = Mutex::new(());

/// Run `images/prepare.sh ARGS…` (stdin closed); returns its output and how
/// long it took. With `live`, its stderr (progress: a kernel build takes
/// minutes) goes straight to ours and `Output::stderr` is empty; otherwise
/// it is captured and echoed afterwards (shown with `--nocapture`).
fn prepare_with(args: &[&std::ffi::OsStr], live: bool) -> (Output, Duration) {
    let script = root().join("images/prepare.sh");
    let start = Instant::now();
    let out = Command::new("sh")
        .arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(if live {
            Stdio::inherit()
        } else {
            Stdio::piped()
        })
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let took = start.elapsed();
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    (out, took)
}

fn prepare(args: &[&std::ffi::OsStr]) -> (Output, Duration) {
    prepare_with(args, false)
}

fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum {} failed", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum output")
        .to_string()
}

/// A line of prepare.sh's stdout.
#[derive(Debug, PartialEq)]
struct Prepared {
    spec: String,
    name: String,
    kernel: PathBuf,
    initramfs: PathBuf,
    kernel_manifest: PathBuf,
    initramfs_manifest: PathBuf,
}

fn parse_stdout(out: &Output) -> Vec<Prepared> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("prepare.sh printed a non-JSON line {line:?}: {e}"));
            let s = |k: &str| {
                v[k].as_str()
                    .unwrap_or_else(|| panic!("no string {k:?} in {line}"))
                    .to_string()
            };
            let keys: Vec<&String> = v.as_object().expect("a JSON object").keys().collect();
            assert_eq!(
                keys.len(),
                6,
                "expected exactly spec, name, kernel, initramfs, kernel_manifest, initramfs_manifest: {line}"
            );
            Prepared {
                spec: s("spec"),
                name: s("name"),
                kernel: s("kernel").into(),
                initramfs: s("initramfs").into(),
                kernel_manifest: s("kernel_manifest").into(),
                initramfs_manifest: s("initramfs_manifest").into(),
            }
        })
        .collect()
}

/// Check one kernel + initramfs pair of `series` and return the kernel
/// manifest.
fn check_prepared(p: &Prepared, series: &str) -> serde_json::Value {
    for f in [
        &p.kernel,
        &p.initramfs,
        &p.kernel_manifest,
        &p.initramfs_manifest,
    ] {
        assert!(f.is_file(), "{}: {} does not exist", p.spec, f.display());
    }
    let km = read_json(&p.kernel_manifest);
    assert_eq!(km["series"], series, "{km}");
    assert_eq!(
        km["source_package"],
        format!("linux-source-{series}"),
        "{km}"
    );
    assert!(
        km["source_version"]
            .as_str()
            .is_some_and(|v| v.starts_with(&format!("{series}."))),
        "{km}"
    );
    let kver = km["kernel_version"].as_str().expect("kernel_version");
    assert!(
        kver.starts_with(&format!("{series}.")),
        "kernel_version {kver}"
    );
    assert_eq!(
        km["vmlinuz_sha256"].as_str(),
        Some(sha256_file(&p.kernel).as_str()),
        "{}: vmlinuz_sha256 is not the sha256 of {}",
        p.spec,
        p.kernel.display()
    );
    let kdir = p.kernel.parent().expect("kernel dir");
    assert_eq!(
        km["config_sha256"].as_str(),
        Some(sha256_file(&kdir.join("config")).as_str()),
        "config_sha256 is not the sha256 of {}/config",
        kdir.display()
    );
    assert!(
        kdir.join("lib/modules").join(kver).is_dir(),
        "no lib/modules/{kver} in {}",
        kdir.display()
    );
    for k in ["built_at", "build_seconds", "inputs_hash"] {
        assert!(!km[k].is_null(), "{}: no {k} in {km}", p.spec);
    }
    // The configuration asked for: virtio built in, the test disks as
    // modules; and none of tinyconfig's size-over-speed choices that change
    // the CPU cost measured: SLUB with per-CPU caches (5.10's tinyconfig
    // picks SLOB, 6.12's SLUB_TINY), -O2, full-size core tables (5.10's
    // BASE_SMALL), static keys.
    let config = std::fs::read_to_string(kdir.join("config")).expect("read config");
    for want in [
        "CONFIG_VIRTIO_BLK=y",
        "CONFIG_VIRTIO_PCI=y",
        "CONFIG_BLK_DEV_NULL_BLK=m",
        "CONFIG_SCSI_DEBUG=m",
        "CONFIG_IO_URING=y",
        "CONFIG_MQ_IOSCHED_DEADLINE=y",
        "CONFIG_SLUB=y",
        "CONFIG_SLUB_CPU_PARTIAL=y",
        "CONFIG_CC_OPTIMIZE_FOR_PERFORMANCE=y",
        "CONFIG_JUMP_LABEL=y",
    ] {
        assert!(
            config.lines().any(|l| l == want),
            "{want} not in {}/config",
            kdir.display()
        );
    }
    for unwanted in [
        "CONFIG_SLOB=y",
        "CONFIG_SLAB=y",
        "CONFIG_SLUB_TINY=y",
        "CONFIG_BASE_SMALL=y",
        "CONFIG_BASE_SMALL=1",
        "CONFIG_CC_OPTIMIZE_FOR_SIZE=y",
    ] {
        assert!(
            !config.lines().any(|l| l == unwanted),
            "{unwanted} in {}/config",
            kdir.display()
        );
    }

    let im = read_json(&p.initramfs_manifest);
    assert_eq!(
        im["sha256"].as_str(),
        Some(sha256_file(&p.initramfs).as_str()),
        "{}: initramfs manifest sha256 is not the file's",
        p.spec
    );
    assert_eq!(
        im["size"].as_u64(),
        Some(std::fs::metadata(&p.initramfs).unwrap().len())
    );
    assert_eq!(im["kernel_version"].as_str(), Some(kver), "{im}");
    assert_eq!(im["mpstat"], true, "{im}");
    assert_eq!(im["guest_scripts"], true, "{im}");
    assert!(
        im["fio"]["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("fio-")),
        "{im}"
    );
    // The small fio, not the system's: the whole image stays small.
    assert!(
        im["size"].as_u64().unwrap() < 12 << 20,
        "initramfs is {} bytes: the small fio should keep it far under 12 MiB",
        im["size"]
    );
    let avail = &im["modules_available"];
    assert_eq!(
        avail["null_blk"].as_array().and_then(|a| a.last()),
        Some(&serde_json::json!("null_blk")),
        "{im}"
    );
    let scsi: Vec<&str> = avail["scsi_debug"]
        .as_array()
        .unwrap_or_else(|| panic!("no scsi_debug in modules_available: {im}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(scsi.last(), Some(&"scsi_debug"), "{im}");
    let pos = |m: &str| scsi.iter().position(|x| *x == m);
    assert!(
        pos("scsi_mod") < pos("sd_mod") && pos("sd_mod").is_some(),
        "scsi_debug's insmod order {scsi:?}"
    );
    km
}

#[test]
fn prepare_builds_plain_and_noplug_kernels_then_hits_the_cache() {
    let cache = common::image_cache();
    let specs = ["build:6.12", "build:6.12+noplug"];
    let mut args: Vec<&std::ffi::OsStr> = vec!["--cache".as_ref(), cache.as_os_str()];
    args.extend(specs.iter().map(|s| std::ffi::OsStr::new(*s)));

    // Live progress: on a new machine this builds the kernel (minutes).
    let (first, took) = prepare_with(&args, true);
    assert!(
        first.status.success(),
        "prepare.sh {specs:?} failed ({}); its messages are above",
        first.status
    );
    let got = parse_stdout(&first);
    eprintln!("[images] first prepare: {:.1}s", took.as_secs_f64());
    assert_eq!(got.len(), 2, "one JSON line per SPEC");
    assert_eq!(
        (got[0].spec.as_str(), got[0].name.as_str()),
        ("build:6.12", "6.12")
    );
    assert_eq!(
        (got[1].spec.as_str(), got[1].name.as_str()),
        ("build:6.12+noplug", "6.12-noplug")
    );
    let plain = check_prepared(&got[0], "6.12");
    let noplug = check_prepared(&got[1], "6.12");
    assert!(
        plain["patch"].is_null(),
        "plain kernel has a patch: {plain}"
    );
    let patch_file = root().join("images/patches/noplug.patch");
    assert_eq!(noplug["patch"]["name"], "noplug", "{noplug}");
    assert_eq!(
        noplug["patch"]["sha256"].as_str(),
        Some(sha256_file(&patch_file).as_str()),
        "the noplug manifest's patch sha256 is not images/patches/noplug.patch's"
    );
    assert_ne!(
        plain["vmlinuz_sha256"], noplug["vmlinuz_sha256"],
        "the noplug kernel is the same as the plain one"
    );
    assert_eq!(
        plain["config_sha256"], noplug["config_sha256"],
        "both variants must have the same .config"
    );
    assert_eq!(plain["kernel_version"], noplug["kernel_version"]);
    assert_ne!(got[0].initramfs, got[1].initramfs);

    // The cached source tree is back to clean: the plug is still in
    // __submit_bio() and the state file says no patch is applied.
    let tree = cache.join("kernel-src/linux-source-6.12");
    let blk_core = std::fs::read_to_string(tree.join("block/blk-core.c")).expect("read blk-core.c");
    assert!(
        blk_core.contains("If plug is not used, add new plug here to cache nsecs time."),
        "{}/block/blk-core.c is still patched",
        tree.display()
    );
    let state = std::fs::read_to_string(tree.join(".blklab/state")).expect("read the tree state");
    assert!(
        state.lines().any(|l| l == "patch=none"),
        "tree state: {state}"
    );

    // Again: nothing to do, the same paths, quickly.
    let (second, took2) = prepare(&args);
    assert!(
        second.status.success(),
        "second prepare.sh failed:\n{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(
        parse_stdout(&second),
        got,
        "a repeated prepare must print the same paths"
    );
    assert_eq!(first.stdout, second.stdout);
    let stderr = String::from_utf8_lossy(&second.stderr);
    for who in [
        "build-kernel",
        "build-fio",
        "fetch-sysstat",
        "build-initramfs",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("{who}: cached"))),
            "the second prepare did not report `{who}: cached`:\n{stderr}"
        );
    }
    for noisy in ["make -j", "configuring", "apt-get source", "built /"] {
        assert!(
            !stderr.contains(noisy),
            "the second prepare did real work ({noisy:?}):\n{stderr}"
        );
    }
    eprintln!(
        "[images] second prepare (cache hit): {:.1}s",
        took2.as_secs_f64()
    );
}

/// `blklab run --kernel SPEC --scenario smoke` once (TCG, no instruction
/// counts, the kernel's info messages on the console): it must pass, each
/// record as a shipped scenario's variant must (`common::scenario_checks`), and
/// the guest must run on the TSC clocksource (`tsc`, or `tsc-early` before
/// its refined calibration; the lab's `clocksource=tsc tsc=reliable`),
/// never falling back to the HPET or the ACPI PM timer, whose emulated
/// reads would dominate the instruction profile.
fn boots_smoke_on_tsc(spec: &str) {
    let _g = BOOT.lock().unwrap_or_else(|p| p.into_inner());
    let out = tempfile::tempdir().expect("tempdir");
    let o = Command::new(common::blklab_bin())
        .args(["run", "--cache"])
        .arg(common::image_cache())
        .args(["--no-progress", "--kernel", spec, "--scenario", "smoke"])
        .args(["--iterations", "1", "--runtime", "1", "--accel", "tcg"])
        .args(["--count-insns", "off", "--append", "loglevel=7", "--out"])
        .arg(out.path())
        .output()
        .expect("run blklab");
    let mut console = String::new();
    if let Ok(rd) = std::fs::read_dir(out.path().join("console")) {
        for e in rd.flatten() {
            console.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    assert!(
        o.status.success(),
        "blklab run --kernel {spec} --scenario smoke failed:\n{}\n{console}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut records = 0;
    for e in std::fs::read_dir(out.path())
        .expect("read the run's dir")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains(".smoke.") && name.ends_with(".json") {
            let r = read_json(&e.path());
            assert_eq!(r["ok"], true, "{spec}: {name} is not ok");
            // tests/shipped_scenarios.rs leaves `smoke` to these boots.
            check_variant(&r);
            assert!(
                r["qemu_command_line"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|a| a
                        .as_str()
                        .is_some_and(|a| a.contains("clocksource=tsc tsc=reliable"))),
                "{spec}: {name}: no clocksource=tsc tsc=reliable on the kernel command line"
            );
            // The record says the clocksource the guest had at the end.
            let cs = r["guest"]["clocksource"].as_str();
            assert!(
                matches!(cs, Some("tsc" | "tsc-early")),
                "{spec}: {name}: guest.clocksource {cs:?}"
            );
            records += 1;
        }
    }
    assert_eq!(records, 2, "{spec}: smoke has two variants (read, write)");
    let switched: Vec<&str> = console
        .lines()
        .filter(|l| l.contains("Switched to clocksource"))
        .collect();
    // tsc-early (the TSC before its refined calibration, which a short
    // guest may not live to see: 6.12 here) reads the TSC too (read_tsc).
    let last = switched
        .last()
        .map(|l| l.trim_end().rsplit(' ').next().unwrap_or(""));
    assert!(
        matches!(last, Some("tsc" | "tsc-early")),
        "{spec}: the guest did not end on the TSC clocksource: {switched:?}\n{console}"
    );
    for bad in [
        "Switched to clocksource hpet",
        "Switched to clocksource acpi_pm",
        "Marking clocksource 'tsc' as unstable",
    ] {
        assert!(
            !console.contains(bad),
            "{spec}: {bad:?} on the console:\n{console}"
        );
    }
    eprintln!("[images] {spec}: smoke passed; {}", switched.join(" | "));
}

/// build:5.10, the kernel from before the 5.14 shared-tags fix (seed 000):
/// Debian 11's linux-source-5.10 (bullseye-security, pinned by
/// `.ci/install-deps`) with the same fragment, and images/kernel/guest-5.10.config
/// on top; built, cached, booted with the smoke scenario.
#[test]
fn prepare_builds_5_10_which_boots_and_runs_smoke_on_tsc() {
    let cache = common::image_cache();
    let args: Vec<&std::ffi::OsStr> =
        vec!["--cache".as_ref(), cache.as_os_str(), "build:5.10".as_ref()];
    let (first, took) = prepare_with(&args, true);
    assert!(
        first.status.success(),
        "prepare.sh build:5.10 failed ({}); its messages are above (no linux-source-5.10? run .ci/install-deps)",
        first.status
    );
    eprintln!("[images] prepare build:5.10: {:.1}s", took.as_secs_f64());
    let got = parse_stdout(&first);
    assert_eq!(got.len(), 1, "one JSON line per SPEC");
    assert_eq!(
        (got[0].spec.as_str(), got[0].name.as_str()),
        ("build:5.10", "5.10")
    );
    let km = check_prepared(&got[0], "5.10");
    assert!(km["patch"].is_null(), "{km}");
    let frag = root().join("images/kernel/guest-5.10.config");
    assert_eq!(
        km["series_config_fragment_sha256"].as_str(),
        Some(sha256_file(&frag).as_str()),
        "{km}"
    );
    let config = std::fs::read_to_string(got[0].kernel.parent().unwrap().join("config")).unwrap();
    assert!(
        config.lines().any(|l| l == "CONFIG_BASE_SMALL=0"),
        "BASE_SMALL"
    );
    // Again: a cache hit.
    let (second, _) = prepare(&args);
    assert!(second.status.success());
    assert_eq!(first.stdout, second.stdout);
    assert!(
        String::from_utf8_lossy(&second.stderr)
            .lines()
            .any(|l| l.starts_with("build-kernel: cached")),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    boots_smoke_on_tsc("build:5.10");
}

/// build:6.12 (prepared by the test above, or here) boots on the TSC too.
#[test]
fn build_6_12_boots_and_runs_smoke_on_tsc() {
    boots_smoke_on_tsc("build:6.12");
}

/// A bad SPEC fails at once, before anything is built, with one
/// `prepare: ERROR: …` line saying what is wrong, and prints nothing on stdout.
#[test]
fn prepare_rejects_bad_specs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let not_a_kernel = dir.path().join("notakernel");
    std::fs::write(&not_a_kernel, vec![0u8; 4096]).unwrap();
    let not_a_kernel_spec = format!("path:{}", not_a_kernel.display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["build:9.99"], "linux-source-9.99"),
        (vec!["path:/nonexistent/bzImage"], "does not exist"),
        (vec![not_a_kernel_spec.as_str()], "not a bzImage"),
        (
            vec!["build:6.12+nosuchpatch"],
            "no patch images/patches/nosuchpatch.patch",
        ),
        (vec!["debian-5.10"], "debian-6.1 and debian-6.12"),
        (vec!["vmlinuz"], "unknown SPEC"),
        (
            vec!["build:6.12", "build:6.12"],
            "two SPECs are named '6.12'",
        ),
        (vec![], "no SPEC given"),
    ];
    for (specs, want) in cases {
        let mut args: Vec<&std::ffi::OsStr> = vec!["--cache".as_ref(), cache.as_os_str()];
        args.extend(specs.iter().map(|s| std::ffi::OsStr::new(*s)));
        let (out, _) = prepare(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "prepare.sh {specs:?} succeeded:\n{stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "prepare.sh {specs:?} printed on stdout: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let error_line = stderr
            .lines()
            .find(|l| l.starts_with("prepare: ERROR: "))
            .unwrap_or_else(|| panic!("no `prepare: ERROR:` line for {specs:?}:\n{stderr}"));
        assert!(
            error_line.contains(want),
            "{specs:?}: expected {want:?} in {error_line:?}"
        );
    }
    assert!(
        !cache.exists(),
        "a bad SPEC must fail before the cache is touched"
    );
}

/// A developer's own kernel keeps its System.map: `path:` takes
/// the System.map beside the image, or at the top of the tree for
/// `arch/x86/boot/bzImage`, or `map=FILE`, and copies it into the cached
/// kernel's directory (where `blklab run` looks for it), keyed by its
/// sha256 and named in the manifest; without one, a note says so.
#[test]
fn path_kernels_keep_their_system_map() {
    let cache = common::image_cache();
    // A real bzImage and its System.map: the 6.12 build (cached).
    let (built, _) = prepare_with(
        &["--cache".as_ref(), cache.as_os_str(), "build:6.12".as_ref()],
        true,
    );
    assert!(built.status.success(), "prepare.sh build:6.12 failed");
    let k = &parse_stdout(&built)[0];
    let map = k.kernel.parent().unwrap().join("System.map");
    assert!(map.is_file(), "build:6.12 has no System.map");
    let map_sha = sha256_file(&map);

    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("linux");
    std::fs::create_dir_all(tree.join("arch/x86/boot")).unwrap();
    std::fs::copy(&k.kernel, tree.join("arch/x86/boot/bzImage")).unwrap();
    std::fs::copy(&map, tree.join("System.map")).unwrap();
    let bare = dir.path().join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(&k.kernel, bare.join("bzImage")).unwrap();

    let in_tree = format!("path:{}/arch/x86/boot/bzImage,name=tree", tree.display());
    let with_map = format!(
        "path:{}/bzImage,map={}/System.map,name=withmap",
        bare.display(),
        tree.display()
    );
    let without = format!("path:{}/bzImage,name=nomap", bare.display());
    let (out, _) = prepare(&[
        "--cache".as_ref(),
        cache.as_os_str(),
        in_tree.as_ref(),
        with_map.as_ref(),
        without.as_ref(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "prepare.sh failed:\n{stderr}");
    let got = parse_stdout(&out);
    assert_eq!(got.len(), 3);
    for p in &got[..2] {
        let kept = p.kernel.parent().unwrap().join("System.map");
        assert!(
            kept.is_file(),
            "{}: no System.map beside {}",
            p.name,
            p.kernel.display()
        );
        assert_eq!(sha256_file(&kept), map_sha, "{}", p.name);
        let m = read_json(&p.kernel_manifest);
        assert_eq!(m["system_map_sha256"], map_sha.as_str(), "{}: {m}", p.name);
    }
    let nomap = &got[2];
    assert!(!nomap.kernel.parent().unwrap().join("System.map").exists());
    assert!(read_json(&nomap.kernel_manifest)["system_map"].is_null());
    assert!(stderr.contains("no System.map beside"), "{stderr}");
    // The map is part of the cache key: the image with and without it are
    // two cached kernels.
    assert_ne!(got[1].kernel, nomap.kernel);

    // A map= that does not exist is refused before anything is built.
    let missing = format!(
        "path:{}/bzImage,map=/nonexistent/System.map",
        bare.display()
    );
    let (out, _) = prepare(&["--cache".as_ref(), cache.as_os_str(), missing.as_ref()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("map=/nonexistent/System.map: no such file"),
        "{stderr}"
    );
}

/// `blklab ARGS…` with `path` as PATH when given; stderr is echoed (shown
/// with `--nocapture`) and returned.
fn blklab(args: &[&str], path: Option<&std::ffi::OsStr>) -> (Output, String) {
    let mut cmd = Command::new(common::blklab_bin());
    cmd.args(args).stdin(Stdio::null());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let out = cmd.output().expect("run blklab");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprint!("{stderr}");
    (out, stderr)
}

/// Prebuilt images: `blklab images build` then `export` from
/// the shared cache, `import` into an empty cache, and `images build` from
/// it again with apt-get, apt-cache, gcc, cc and make replaced by scripts
/// that fail loudly: every step is a cache hit (kernel, fio, mpstat,
/// initramfs, the plugin), nothing calls them, and the paths are the
/// imported cache's. The archive's keys are `images key`'s (the same
/// without apt), `images list` says what each key was built from, and a
/// flipped byte is refused.
#[test]
fn imported_images_need_no_compiler_and_no_apt() {
    let cache = common::image_cache();
    let cache_s = cache.to_str().unwrap();
    let spec = "build:6.12";
    let t0 = Instant::now();
    let (out, err) = blklab(&["images", "build", "--cache", cache_s, spec], None);
    assert!(out.status.success(), "images build failed:\n{err}");
    eprintln!("images build (shared cache): {:?}", t0.elapsed());

    let (out, err) = blklab(&["images", "key", "--json", spec], None);
    assert!(out.status.success(), "images key failed:\n{err}");
    let keys: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let key = keys["specs"][0]["key"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 64);
    assert!(keys["plugin"]["key"].is_string(), "{keys}");

    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("images.tar");
    let archive_s = archive.to_str().unwrap();
    let t0 = Instant::now();
    let (out, err) = blklab(
        &[
            "images", "export", "--cache", cache_s, "--out", archive_s, spec,
        ],
        None,
    );
    assert!(out.status.success(), "images export failed:\n{err}");
    eprintln!("images export: {:?}", t0.elapsed());
    let index = blklab::lab::images::archive::read_index(&archive).unwrap();
    assert_eq!(index.specs[0].key, key, "export and `images key` agree");
    let kinds: Vec<String> = index
        .entries
        .iter()
        .map(|e| {
            serde_json::to_value(e.kind)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        ["kernel", "initramfs", "fio", "mpstat", "qemu-plugin"],
        "{index:?}"
    );
    let kernel_files: Vec<&str> = index.entries[0]
        .files
        .iter()
        .map(|f| f.path.as_str())
        .collect();
    for f in ["vmlinuz", "System.map", "config", "manifest.json"] {
        assert!(
            kernel_files.contains(&format!("kernel-build-6.12/{f}").as_str()),
            "{f} not exported: {kernel_files:?}"
        );
    }

    let fresh = dir.path().join("cache");
    let fresh_s = fresh.to_str().unwrap();
    let offline = common::offline::NoBuildTools::new(dir.path());
    offline.assert_armed();
    // The keys need neither apt nor a compiler: the same without them.
    let (out, err) = blklab(&["images", "key", "--json", spec], Some(&offline.path));
    assert!(
        out.status.success(),
        "images key without apt failed:\n{err}"
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
        keys
    );
    assert_eq!(offline.calls(), "", "images key called apt or a compiler");
    let (out, err) = blklab(
        &["images", "import", "--cache", fresh_s, archive_s],
        Some(&offline.path),
    );
    assert!(out.status.success(), "images import failed:\n{err}");
    assert!(!err.contains("imported with key"), "{err}");
    let t0 = Instant::now();
    let (out, err) = blklab(
        &["images", "build", "--cache", fresh_s, spec],
        Some(&offline.path),
    );
    eprintln!(
        "images build (imported cache, no build tools): {:?}",
        t0.elapsed()
    );
    assert!(
        out.status.success(),
        "images build on the imported cache failed:\n{err}"
    );
    assert_eq!(offline.calls(), "", "forbidden tools were called:\n{err}");
    for what in [
        "build-fio: cached",
        "fetch-sysstat: cached",
        "build-kernel: cached",
        "build-initramfs: cached",
    ] {
        assert!(err.contains(what), "no `{what}`:\n{err}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().next().unwrap();
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields[0], spec);
    assert!(fields[1].starts_with(fresh_s), "{line}");
    assert!(fields[2].starts_with(fresh_s), "{line}");
    let plugin = stdout
        .lines()
        .find_map(|l| l.strip_prefix("qemu-plugin\t"))
        .unwrap_or_else(|| panic!("no plugin line: {stdout}"));
    assert!(plugin.starts_with(fresh_s), "{plugin}");

    // What each key was built from.
    let (out, err) = blklab(&["images", "list", "--json", "--cache", fresh_s], None);
    assert!(out.status.success(), "images list failed:\n{err}");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kernel = list
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "kernel-build-6.12")
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(kernel["key"], index.entries[0].key.as_str());
    assert_eq!(kernel["package"], "linux-source-6.12");
    assert!(kernel["version"].as_str().unwrap().starts_with("6.12."));
    assert!(kernel["config_sha256"].as_str().unwrap().len() == 64);
    assert!(kernel["size"].as_u64().unwrap() > 1_000_000);
    let initramfs = list
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "initramfs")
        .unwrap();
    assert_eq!(initramfs["key"], key.as_str());
    let (out, _) = blklab(&["images", "list", "--cache", fresh_s], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("linux-source-6.12 6.12."), "{text}");

    // An archive of another checkout (its spec's key differs from this
    // tree's): imported, with a warning that a run from here rebuilds it.
    let other_checkout = dir.path().join("other-checkout.tar");
    {
        let mut src = tar::Archive::new(std::fs::File::open(&archive).unwrap());
        let mut dst = tar::Builder::new(std::fs::File::create(&other_checkout).unwrap());
        for m in src.entries().unwrap() {
            let mut m = m.unwrap();
            let name = String::from_utf8_lossy(&m.path_bytes()).into_owned();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut m, &mut data).unwrap();
            if name == "index.json" {
                let mut v: serde_json::Value = serde_json::from_slice(&data).unwrap();
                v["specs"][0]["key"] = "0".repeat(64).into();
                data = serde_json::to_vec(&v).unwrap();
            }
            let mut h = m.header().clone();
            h.set_size(data.len() as u64);
            h.set_cksum();
            dst.append_data(&mut h, &name, data.as_slice()).unwrap();
        }
        dst.finish().unwrap();
    }
    let elsewhere = dir.path().join("elsewhere");
    let (out, err) = blklab(
        &[
            "images",
            "import",
            "--cache",
            elsewhere.to_str().unwrap(),
            other_checkout.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("{spec}: imported with key {}", "0".repeat(64))),
        "no warning about the other checkout's key:\n{err}"
    );

    // One flipped byte in the kernel: refused, nothing enters the cache.
    let mut bytes = std::fs::read(&archive).unwrap();
    let vmlinuz = index.entries[0]
        .files
        .iter()
        .find(|f| f.path.ends_with("/vmlinuz"))
        .unwrap();
    let needle = std::fs::read(cache.join(&vmlinuz.path)).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == &needle[1000..1064])
        .expect("the vmlinuz is in the archive as it is");
    bytes[at] ^= 0x40;
    let bad = dir.path().join("bad.tar");
    std::fs::write(&bad, bytes).unwrap();
    let other = dir.path().join("other");
    let (out, err) = blklab(
        &[
            "images",
            "import",
            "--cache",
            other.to_str().unwrap(),
            bad.to_str().unwrap(),
        ],
        None,
    );
    assert!(!out.status.success(), "a damaged archive was imported");
    assert!(
        err.contains("kernel-build-6.12/vmlinuz: its sha256 does not match the index"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!other.join("kernel-build-6.12").exists());
}

/// The nested mode's host image (images/build-nested-host.sh): its key
/// needs neither apt nor a compiler and is the script's own; `images build
/// --nested-host` makes it in the shared cache (a cache hit after the first
/// run: a few seconds, plus the debian-6.12 download on a fresh machine),
/// with the modules, QEMU and firmware the manifest names and no /lab/run;
/// `images list` shows it, and an export imported into an empty cache is a
/// hit there without build tools.
#[test]
fn nested_host_image_is_keyed_offline_built_listed_and_exported() {
    let dir = tempfile::tempdir().unwrap();
    let offline = common::offline::NoBuildTools::new(dir.path());
    offline.assert_armed();
    let (out, err) = blklab(
        &["images", "key", "--json", "--no-plugin", "--nested-host"],
        Some(&offline.path),
    );
    assert!(
        out.status.success(),
        "images key --nested-host failed:\n{err}"
    );
    assert_eq!(offline.calls(), "", "images key called apt or a compiler");
    let keys: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(keys["specs"], serde_json::json!([]), "{keys}");
    let host = &keys["nested_host"];
    let key = host["key"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 64, "{keys}");
    let hdir = format!("nested-host-{}", &key[..16]);
    assert_eq!(host["dir"], hdir.as_str());
    assert!(host["qemu"]
        .as_str()
        .unwrap()
        .starts_with("qemu-system-x86 "));
    let script = Command::new("sh")
        .arg(root().join("images/build-nested-host.sh"))
        .arg("--key")
        .output()
        .unwrap();
    assert!(script.status.success());
    let own: serde_json::Value = serde_json::from_slice(&script.stdout).unwrap();
    assert_eq!(&own, host, "the script's --key and blklab's agree");

    let cache = common::image_cache();
    let cache_s = cache.to_str().unwrap();
    let t0 = Instant::now();
    let (out, err) = blklab(
        &[
            "images",
            "build",
            "--cache",
            cache_s,
            "--no-plugin",
            "--nested-host",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "images build --nested-host failed:\n{err}"
    );
    eprintln!("images build --nested-host: {:?}", t0.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let fields: Vec<&str> = stdout.trim().split('\t').collect();
    assert_eq!(fields.len(), 3, "{stdout}");
    assert_eq!(fields[0], "nested-host");
    let (kernel, cpio) = (PathBuf::from(fields[1]), PathBuf::from(fields[2]));
    assert_eq!(kernel, cache.join(&hdir).join("vmlinuz"));
    assert_eq!(cpio, cache.join(&hdir).join("host.cpio"));
    let len = std::fs::metadata(&cpio).unwrap().len();
    assert_eq!(
        len % 512,
        0,
        "an archive appended to host.cpio starts aligned"
    );
    let m = read_json(&cache.join(&hdir).join("manifest.json"));
    assert_eq!(m["kind"], "nested-host");
    assert_eq!(m["inputs_hash"], key.as_str());
    assert_eq!(m["host_cpio_sha256"], sha256_file(&cpio).as_str());
    let modules: Vec<&str> = m["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for want in ["kvm_amd", "kvm", "virtio_blk"] {
        assert!(modules.contains(&want), "{want} not in {modules:?}");
    }
    let kver = m["kernel_version"].as_str().unwrap();
    assert!(kver.starts_with("6.12."), "{m}");
    // The archive holds what the manifest lists, and nothing under /lab/run.
    let listing = Command::new("cpio")
        .args(["-t", "--quiet"])
        .stdin(std::fs::File::open(&cpio).unwrap())
        .output()
        .unwrap();
    assert!(listing.status.success());
    let names = String::from_utf8_lossy(&listing.stdout).into_owned();
    for f in m["files"].as_array().unwrap() {
        let p = f["path"].as_str().unwrap();
        assert!(
            names.lines().any(|n| n == &p[1..]),
            "{p} is not in host.cpio"
        );
    }
    for want in [
        "init".to_string(),
        "usr/bin/qemu-system-x86_64".to_string(),
        format!("lib/modules/{kver}/modules.dep"),
        "usr/share/seabios/bios-256k.bin".to_string(),
        "lib64/ld-linux-x86-64.so.2".to_string(),
        "lib/x86_64-linux-gnu/libgcc_s.so.1".to_string(),
    ] {
        assert!(names.lines().any(|n| n == want), "no {want} in host.cpio");
    }
    assert!(!names.lines().any(|n| n.starts_with("lab/run")), "{names}");

    let (out, err) = blklab(&["images", "list", "--json", "--cache", cache_s], None);
    assert!(out.status.success(), "images list failed:\n{err}");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = list
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == hdir.as_str())
        .unwrap_or_else(|| panic!("{hdir} not listed: {list}"));
    assert_eq!(listed["kind"], "nested-host");
    assert_eq!(listed["key"], key.as_str());
    assert_eq!(listed["package"], "qemu-system-x86");

    let archive = dir.path().join("host.tar");
    let (out, err) = blklab(
        &[
            "images",
            "export",
            "--cache",
            cache_s,
            "--no-plugin",
            "--nested-host",
            "--out",
            archive.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "images export --nested-host failed:\n{err}"
    );
    let index = blklab::lab::images::archive::read_index(&archive).unwrap();
    assert_eq!(index.nested_host.as_ref().unwrap().key, key);
    assert_eq!(index.entries.len(), 1);
    let fresh = dir.path().join("cache");
    let fresh_s = fresh.to_str().unwrap();
    let (out, err) = blklab(
        &[
            "images",
            "import",
            "--cache",
            fresh_s,
            archive.to_str().unwrap(),
        ],
        Some(&offline.path),
    );
    assert!(out.status.success(), "images import failed:\n{err}");
    let (out, err) = blklab(
        &[
            "images",
            "build",
            "--cache",
            fresh_s,
            "--no-plugin",
            "--nested-host",
        ],
        Some(&offline.path),
    );
    assert!(
        out.status.success(),
        "images build on the import failed:\n{err}"
    );
    assert!(err.contains("build-nested-host: cached"), "{err}");
    assert_eq!(offline.calls(), "", "forbidden tools were called:\n{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{fresh_s}/{hdir}/host.cpio")));
}

/// The nested host image boots under TCG with an SVM CPU (`-cpu EPYC`) and
/// does what its /init promises: `BLKLAB-HOST-INIT … kvm=yes`, the lab's
/// per-run archive appended to host.cpio found at /lab/run, `blklab
/// nested-inner /lab/run/inner.json` run (here a script standing in for
/// it) with its stderr in /results/blklab.log, /results written as a tar
/// to the `blklab-results` disk, `BLKLAB-HOST-END rc=N` with its status.
/// The script starts the image's QEMU under KVM on q35 with the firmware a
/// `-kernel` boot reads, paused (`-S`), and quits from the monitor: the
/// binary, its libraries, the firmware and /dev/kvm are there (a whole
/// guest boot under nested KVM takes a minute: images/README.md, "By
/// hand"). About 15 s.
#[test]
fn nested_host_boots_with_kvm_and_writes_the_results_disk() {
    let cache = common::image_cache();
    let (out, err) = blklab(
        &[
            "images",
            "build",
            "--cache",
            cache.to_str().unwrap(),
            "--no-plugin",
            "--nested-host",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "images build --nested-host failed:\n{err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let fields: Vec<&str> = stdout.trim().split('\t').collect();
    let (kernel, host_cpio) = (PathBuf::from(fields[1]), PathBuf::from(fields[2]));

    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("stage/lab/run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::copy(&kernel, run.join("vmlinuz")).unwrap();
    std::fs::write(run.join("inner.json"), "{}\n").unwrap();
    std::fs::write(
        run.join("blklab"),
        "#!/bin/sh\n\
         echo \"stand-in args=$*\" >&2\n\
         ls /dev/kvm > /results/kvm\n\
         echo quit | qemu-system-x86_64 -accel kvm -cpu host -M q35 -m 128M -display none \\\n\
           -vga none -nic none -S -monitor stdio -kernel /lab/run/vmlinuz > /results/qemu.log 2>&1\n\
         echo \"STAND-IN qemu rc=$?\"\n\
         exit 5\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(run.join("blklab"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
    let run_cpio = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find lab | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet")
        .arg("sh")
        .arg(dir.path().join("stage"))
        .output()
        .expect("run cpio");
    assert!(run_cpio.status.success(), "cpio failed");
    let mut initrd = std::fs::read(&host_cpio).unwrap();
    initrd.extend_from_slice(&run_cpio.stdout);
    let combined = dir.path().join("combined.cpio");
    std::fs::write(&combined, initrd).unwrap();
    let results = dir.path().join("results.img");
    std::fs::File::create(&results)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();

    // The second serial port: where the host copies the inner lab's log
    // as it is written.
    let inner_log = dir.path().join("inner.log");

    let _g = BOOT.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    let o = Command::new("timeout")
        .args([
            "600",
            "qemu-system-x86_64",
            "-accel",
            "tcg,thread=multi",
            "-cpu",
            "EPYC",
        ])
        .args(["-smp", "2", "-m", "1G", "-kernel"])
        .arg(&kernel)
        .arg("-initrd")
        .arg(&combined)
        .args([
            "-append",
            "console=ttyS0 quiet loglevel=3 panic=-1",
            "-display",
            "none",
        ])
        .args(["-serial", "stdio", "-serial"])
        .arg(format!("file:{}", inner_log.display()))
        .args(["-monitor", "none", "-no-reboot", "-nic", "none"])
        .arg("-drive")
        .arg(format!(
            "file={},if=none,format=raw,id=r",
            results.display()
        ))
        .args(["-device", "virtio-blk-pci,drive=r,serial=blklab-results"])
        .stdin(Stdio::null())
        .output()
        .expect("run qemu-system-x86_64");
    let console = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("nested host boot: {:?}\n{console}", t0.elapsed());
    assert!(
        o.status.success(),
        "QEMU failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let init = console
        .lines()
        .find(|l| l.starts_with("BLKLAB-HOST-INIT "))
        .unwrap_or_else(|| panic!("no BLKLAB-HOST-INIT:\n{console}"));
    assert!(init.starts_with("BLKLAB-HOST-INIT kernel=6.12."), "{init}");
    assert!(init.ends_with(" kvm=yes cpus=2 heartbeat=15"), "{init}");
    assert!(!console.contains("BLKLAB-HOST-ERROR"), "{console}");
    assert!(console.contains("STAND-IN qemu rc=0"), "{console}");
    assert!(console.contains("BLKLAB-HOST-END rc=5"), "{console}");

    let mut tar = tar::Archive::new(std::fs::File::open(&results).unwrap());
    let mut files = std::collections::BTreeMap::new();
    for e in tar.entries().expect("the results disk holds a tar") {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut e, &mut text).unwrap();
        files.insert(name, text);
    }
    assert_eq!(files["./kvm"], "/dev/kvm\n");
    // The host's clock devices first, then what the inner lab wrote.
    let (clocks, rest) = files["./blklab.log"].split_once('\n').expect("two lines");
    assert!(
        clocks.starts_with("host clocks: clocksource=") && clocks.contains(" clockevent0="),
        "{clocks}"
    );
    assert_eq!(rest, "stand-in args=nested-inner /lab/run/inner.json\n");
    let live = std::fs::read_to_string(&inner_log).unwrap();
    assert_eq!(
        live.replace("\r\n", "\n"),
        files["./blklab.log"],
        "the inner lab's log on the host's second serial port"
    );
    assert!(
        !files["./qemu.log"].contains("rror"),
        "{}",
        files["./qemu.log"]
    );
}

/// The kernel build's progress line (images/kernel-config.sh, sourced by
/// build-kernel.sh and build-tree.sh): steps of those expected and the
/// time left for a full build, the expected steps from the tree's own last
/// full build, else images/kernel/build-steps for its version, else none.
#[test]
fn kernel_build_progress_estimates_what_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("linux");
    std::fs::create_dir_all(tree.join(".blklab")).unwrap();
    let sh = |script: &str| -> String {
        let out = std::process::Command::new("dash")
            .arg("-c")
            .arg(format!(
                "HERE=\"$1\"; log() {{ echo \"$*\"; }}; . \"$HERE/kernel-config.sh\"; {script}"
            ))
            .arg("sh")
            .arg(root().join("images"))
            .arg(&tree)
            .output()
            .expect("run dash");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(
        sh("kconfig_progress 100 500 2000"),
        "500 of ~2000 build steps (25 %), ~300s left"
    );
    assert_eq!(sh("kconfig_progress 100 12 ''"), "12 build steps");
    assert_eq!(
        sh("kconfig_progress 100 2100 2000"),
        "2100 of ~2000 build steps (finishing)"
    );
    // No Makefile, no record: no estimate.
    assert_eq!(sh("kconfig_full_steps \"$2\""), "");
    // A 6.12 tree: the shipped measurement.
    std::fs::write(
        tree.join("Makefile"),
        "# SPDX\nVERSION = 6\nPATCHLEVEL = 12\nSUBLEVEL = 117\n",
    )
    .unwrap();
    let shipped = std::fs::read_to_string(root().join("images/kernel/build-steps")).unwrap();
    let want = shipped
        .lines()
        .find_map(|l| l.strip_prefix("6.12 "))
        .expect("images/kernel/build-steps has 6.12")
        .trim()
        .to_string();
    assert_eq!(sh("kconfig_full_steps \"$2\""), want);
    // A series the file does not list: none.
    std::fs::write(tree.join("Makefile"), "VERSION = 6\nPATCHLEVEL = 10\n").unwrap();
    assert_eq!(sh("kconfig_full_steps \"$2\""), "");
    // The tree's own last full build wins.
    std::fs::write(tree.join(".blklab/full-build"), "steps 1234\nseconds 300\n").unwrap();
    assert_eq!(sh("kconfig_full_steps \"$2\""), "1234");
}
