//! The offline lab bundle: `blklab images export --bundle build:6.12` (the
//! guest images, QEMU itself with its libraries, ELF loader, firmware and
//! instruction-count plugin, the lab tree and the blklab binary), and
//! nothing else, runs the lab on a host made to look like one without
//! Debian's packages or a checkout: the blklab binary is taken out of the
//! archive with plain `tar`, and it imports the archive into an empty
//! cache and runs from a directory outside the checkout, with no
//! `--lab-dir` and no `BLKLAB_LAB_DIR`, in a private mount namespace
//! (`unshare --mount --propagation private`) where the host's QEMU binary,
//! busybox and cpio are `/dev/null`, QEMU's firmware and module
//! directories and the checkout itself (the tree the binary was built
//! from) empty tmpfs, and apt-get, apt-cache, gcc, cc and make on PATH
//! fail loudly. One smoke boot there must succeed with the bundle's QEMU
//! (loaded by the bundle's loader with the bundle's libraries only), the
//! bundle's plugin and the imported lab tree, its records ok, run.json
//! naming the bundle's QEMU, and no QEMU left behind; and a blklab killed
//! (SIGKILL) while its guest boots takes the bundle's QEMU along.
//!
//! Needs root (the mount namespace), the image cache of `tests/images.rs`
//! (build:6.12 is built there on first use: minutes) and the installed
//! QEMU with its plugin (built on first use, as `images build` does).
//!
//! Run: `cargo test --test bundle -- --nocapture`

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::offline::NoBuildTools;
use common::read_json;
use common::scenario_checks::check_variant;

const SPEC: &str = "build:6.12";

/// What the namespace hides: binaries (a `/dev/null` bound over each) and
/// directories (an empty tmpfs over each). /bin is /usr/bin on Debian 12.
const HIDDEN_FILES: &[&str] = &[
    "/usr/bin/qemu-system-x86_64",
    "/usr/bin/busybox",
    "/usr/bin/cpio",
];
const HIDDEN_DIRS: &[&str] = &[
    "/usr/share/qemu",
    "/usr/share/seabios",
    "/usr/lib/ipxe/qemu",
    "/usr/lib/x86_64-linux-gnu/qemu",
];

/// The namespace's `sh -c` script: hide, check that it is hidden (exit 90
/// and a line on stderr when not), then exec its arguments. The third
/// argument is the checkout, hidden like the directories.
const HIDE: &str = r#"set -eu
files=$1 dirs=$2 checkout=$3
shift 3
for f in $files; do mount --bind /dev/null "$f"; done
for d in $dirs "$checkout"; do
    mount -t tmpfs -o size=1m,mode=755 blklab-hidden "$d"
    [ -z "$(ls -A "$d")" ] || { echo "HIDE: $d is not empty" >&2; exit 90; }
done
[ ! -e "$checkout/images/prepare.sh" ] || { echo "HIDE: the checkout is still there" >&2; exit 90; }
for t in qemu-system-x86_64 busybox cpio; do
    if command -v "$t" >/dev/null 2>&1; then echo "HIDE: $t is still on PATH" >&2; exit 90; fi
done
[ ! -x /bin/busybox ] || { echo "HIDE: /bin/busybox is still there" >&2; exit 90; }
exec "$@"
"#;

/// `blklab ARGS…`; its stderr is echoed (shown with `--nocapture`).
fn blklab(args: &[&str]) -> Output {
    let out = Command::new(common::blklab_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run blklab");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "blklab {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The host as the test makes it: its PATH (without build tools) and the
/// directory its commands run in, outside the checkout.
struct Host<'a> {
    path: &'a std::ffi::OsStr,
    cwd: &'a Path,
}

/// `PROGRAM ARGS…` in a new private mount namespace with the host's QEMU,
/// firmware, busybox, cpio and the checkout hidden, `host.path` as PATH,
/// `host.cwd` as the directory and no `BLKLAB_LAB_DIR`. unshare and the
/// script exec: the process is PROGRAM's.
fn hidden_command(host: &Host<'_>, program: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        HIDE,
        "hide",
    ])
    .arg(HIDDEN_FILES.join(" "))
    .arg(HIDDEN_DIRS.join(" "))
    .arg(common::root())
    .arg(program)
    .args(args)
    .env("PATH", host.path)
    .env_remove("BLKLAB_LAB_DIR")
    .current_dir(host.cwd)
    .stdin(Stdio::null());
    c
}

fn hidden(host: &Host<'_>, program: &Path, args: &[&str]) -> Output {
    hidden_command(host, program, args)
        .output()
        .expect("run unshare (util-linux)")
}

/// The libraries the process that execs the bundle's loader initialises
/// (`LD_DEBUG=libs`: "PID: calling init: PATH"), from that exec on: the
/// wrapper's own shell and tools come first, on the host's loader.
fn libraries_after_exec(ld_debug: &str, bundle: &Path) -> Vec<String> {
    let loader = bundle.join("lib/ld-linux-x86-64.so.2");
    let loader = loader.to_str().unwrap();
    let inits: Vec<(&str, &str)> = ld_debug
        .lines()
        .filter_map(|l| {
            let (pid, rest) = l.split_once(':')?;
            Some((pid.trim(), rest.trim().strip_prefix("calling init: ")?))
        })
        .collect();
    let Some(start) = inits.iter().position(|(_, p)| *p == loader) else {
        return Vec::new();
    };
    let pid = inits[start].0;
    inits[start..]
        .iter()
        .filter(|(p, _)| *p == pid)
        .map(|(_, lib)| lib.to_string())
        .collect()
}

/// The bundle's QEMUs running: the processes whose command line names
/// the bundle's QEMU binary.
fn qemus_of(bundle: &Path) -> Vec<String> {
    let binary = bundle.join("libexec/qemu-system-x86_64");
    let needle = binary.to_str().unwrap().as_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| c.windows(needle.len()).any(|w| w == needle))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .collect()
}

/// SIGKILL to a blklab run whose guest boots under the bundle's QEMU:
/// the QEMU goes too (PR_SET_PDEATHSIG, set before the wrapper's exec and
/// kept across it and the loader's).
fn a_killed_run_takes_the_bundles_qemu_along(host: &Host<'_>, blklab: &Path, cache: &Path) {
    let bundle = bundle_in(cache);
    assert_eq!(qemus_of(&bundle), Vec::<String>::new());
    let dir = host.cwd;
    let out_dir = dir.join("killed");
    let mut cmd = hidden_command(
        host,
        blklab,
        &[
            "run",
            "--cache",
            cache.to_str().unwrap(),
            "--kernel",
            SPEC,
            "--scenario",
            "smoke",
            "--iterations",
            "1",
            "--count-insns",
            "off",
            "--accel",
            "tcg",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    // The boot's socket directory, which a SIGKILL leaves, stays in here.
    let mut child = cmd
        .env("TMPDIR", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run unshare (util-linux)");
    let qemu = common::wait_for(
        "the bundle's QEMU to start",
        Duration::from_secs(300),
        || {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("blklab run ended ({st}) before its QEMU started");
            }
            // The guest's QEMU, not the `--version` blklab asks first.
            qemus_of(&bundle)
                .into_iter()
                .find(|c| c.contains(" -kernel "))
        },
    );
    // SAFETY: kill(2) on our own child (blklab: unshare and sh exec it).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    child.wait().unwrap();
    common::wait_for(
        "the bundle's QEMU to die with blklab",
        Duration::from_secs(60),
        || qemus_of(&bundle).is_empty().then_some(()),
    );
    eprintln!("killed blklab; its QEMU died with it: {qemu}");
}

/// The `PREFIX…` directory of `cache` (`qemu-bundle-KEY`, `lab-KEY`).
fn entry_in(cache: &Path, prefix: &str) -> std::path::PathBuf {
    std::fs::read_dir(cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .unwrap_or_else(|| panic!("the import installed no {prefix}KEY directory"))
}

/// The `qemu-bundle-KEY` directory of `cache`.
fn bundle_in(cache: &Path) -> std::path::PathBuf {
    entry_in(cache, "qemu-bundle-")
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The blklab binary taken out of `archive` with plain tar, as the user
/// guide says, into `dir`; returns its path.
fn take_blklab_out(archive: &Path, dir: &Path) -> std::path::PathBuf {
    let o = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .args(["--wildcards", "--strip-components=2", "lab-*/bin/blklab"])
        .current_dir(dir)
        .output()
        .expect("run tar");
    assert!(
        o.status.success(),
        "tar: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bin = dir.join("blklab");
    assert_eq!(sha256_of(&bin), sha256_of(&common::blklab_bin()));
    bin
}

/// Export with `--bundle` from the shared cache, check the archive holds
/// the bundle under `images key --bundle`'s key; returns the archive.
fn export_bundle(dir: &Path) -> std::path::PathBuf {
    let cache = common::image_cache();
    let cache_s = cache.to_str().unwrap();
    blklab(&["images", "build", "--cache", cache_s, "--bundle", SPEC]);
    let archive = dir.join("images.tar");
    let t0 = Instant::now();
    blklab(&[
        "images",
        "export",
        "--cache",
        cache_s,
        "--bundle",
        "--out",
        archive.to_str().unwrap(),
        SPEC,
    ]);
    eprintln!("images export --bundle: {:?}", t0.elapsed());
    let keys: serde_json::Value =
        serde_json::from_slice(&blklab(&["images", "key", "--json", "--bundle", SPEC]).stdout)
            .unwrap();
    let index = blklab::lab::images::archive::read_index(&archive).unwrap();
    // The lab tree: this blklab, prepare.sh and the guest scripts with
    // their scenarios; not what no run reads.
    let lab = index.lab.as_ref().expect("the index names the lab tree");
    let entry = index
        .entries
        .iter()
        .find(|e| e.key == lab.key)
        .expect("the lab tree's entry");
    let file = |f: &str| {
        entry
            .files
            .iter()
            .find(|r| r.path == format!("{}/{f}", lab.dir))
    };
    for f in [
        "bin/blklab",
        "images/prepare.sh",
        "images/build-initramfs.sh",
        "guest-scripts/lab.sh",
        "guest-scripts/scenarios/smoke.scn",
        "manifest.json",
    ] {
        assert!(file(f).is_some(), "{f} is not in the lab tree");
    }
    for f in ["images/demo.sh", "images/README.md", "images/build-tree.sh"] {
        assert!(file(f).is_none(), "{f} is in the lab tree");
    }
    assert_eq!(
        file("bin/blklab").unwrap().sha256,
        sha256_of(&common::blklab_bin()),
        "the binary is the blklab that exported"
    );
    let bundle = index.bundle.as_ref().expect("the index names the bundle");
    assert_eq!(bundle.key, keys["bundle"]["key"].as_str().unwrap());
    let entry = index
        .entries
        .iter()
        .find(|e| e.key == bundle.key)
        .expect("the bundle's entry");
    let files: Vec<&str> = entry.files.iter().map(|f| f.path.as_str()).collect();
    for f in [
        "bin/qemu-system-x86_64",
        "libexec/qemu-system-x86_64",
        "lib/ld-linux-x86-64.so.2",
        "lib/libc.so.6",
        "lib/libglib-2.0.so.0",
        "share/qemu/bios-256k.bin",
        "share/qemu/vgabios-stdvga.bin",
        "plugin/libblklab-insns.so",
        "manifest.json",
    ] {
        assert!(
            files.iter().any(|p| p.ends_with(&format!("/{f}"))),
            "{f} is not in the bundle: {files:?}"
        );
    }
    archive
}

#[test]
fn an_imported_bundle_runs_the_lab_without_the_hosts_qemu_busybox_cpio_or_a_compiler() {
    let dir = tempfile::tempdir().unwrap();
    let archive = export_bundle(dir.path());
    let host_version = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .expect("the host's QEMU");
    let host_version = String::from_utf8_lossy(&host_version.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string();

    // The host: the archive, and nothing of the checkout.
    assert!(
        !dir.path().starts_with(common::root()),
        "the temporary directory must lie outside the checkout (TMPDIR)"
    );
    let cwd = dir.path().join("host");
    std::fs::create_dir_all(&cwd).unwrap();
    let host_blklab = take_blklab_out(&archive, &cwd);
    let fresh = dir.path().join("cache");
    let offline = NoBuildTools::new(dir.path());
    offline.assert_armed();
    let host = Host {
        path: &offline.path,
        cwd: &cwd,
    };
    let o = hidden(
        &host,
        &host_blklab,
        &[
            "images",
            "import",
            "--cache",
            fresh.to_str().unwrap(),
            archive.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    eprint!("{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "images import failed:\n{stdout}");
    let bundle = bundle_in(&fresh);
    let lab_tree = entry_in(&fresh, "lab-");
    assert!(stdout.contains("  lab (blklab "), "{stdout}");
    let wrapper = bundle.join("bin/qemu-system-x86_64");

    // The bundle's QEMU, with the host's hidden: its own loader maps its
    // own libraries only, and it is the host's QEMU's version.
    let o = hidden(
        &host,
        Path::new("env"),
        &["LD_DEBUG=libs", wrapper.to_str().unwrap(), "--version"],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the bundle's QEMU --version:\n{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().next(),
        Some(host_version.as_str())
    );
    let libs = libraries_after_exec(&stderr, &bundle);
    assert!(libs.len() > 10, "no exec of the bundle's loader:\n{stderr}");
    for lib in &libs {
        assert!(
            lib.starts_with(bundle.to_str().unwrap()),
            "the bundle's QEMU loaded {lib}, a library of the host's"
        );
    }

    // One smoke boot, instructions counted: the bundle's plugin.
    let out_dir = dir.path().join("run");
    let t0 = Instant::now();
    let o = hidden(
        &host,
        &host_blklab,
        &[
            "run",
            "--cache",
            fresh.to_str().unwrap(),
            "--kernel",
            SPEC,
            "--scenario",
            "smoke",
            "--iterations",
            "1",
            "--runtime",
            "1",
            "--count-insns",
            "on",
            "--no-progress",
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    eprintln!("{stderr}blklab run through the bundle: {:?}", t0.elapsed());
    assert!(o.status.success(), "blklab run failed:\n{stderr}");
    assert_eq!(
        offline.calls(),
        "",
        "apt or a compiler was called:\n{stderr}"
    );
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("QEMU: the bundle's"))
        .collect();
    assert_eq!(
        said.len(),
        1,
        "one line says the bundle's QEMU runs:\n{stderr}"
    );
    assert!(
        said[0].contains("no qemu-system-x86_64 on PATH"),
        "{}",
        said[0]
    );
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("lab tree: the imported one"))
        .collect();
    assert_eq!(
        said.len(),
        1,
        "one line says the imported lab tree is the lab directory:\n{stderr}"
    );
    assert!(
        said[0].contains(&format!("one, {} (", lab_tree.display())),
        "{}",
        said[0]
    );
    assert!(
        stderr.contains(&format!(
            "instruction-count plugin: the bundle's, {}",
            bundle.join("plugin/libblklab-insns.so").display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("build-initramfs: cached: {}", fresh.display())),
        "{stderr}"
    );
    let run = read_json(&out_dir.join("run.json"));
    assert_eq!(run["qemu"]["path"], wrapper.to_str().unwrap());
    assert_eq!(run["qemu"]["version"], host_version.as_str());
    let mut records = 0;
    for v in ["read", "write"] {
        let r = read_json(&out_dir.join(format!("6.12.smoke.{v}.00.json")));
        check_variant(&r);
        assert_eq!(r["qemu_command_line"][0], wrapper.to_str().unwrap());
        assert!(
            r["instructions"]["kernel"].as_u64().is_some_and(|n| n > 0),
            "{v}: no kernel instructions counted: {}",
            r["instructions"]
        );
        records += 1;
    }
    assert_eq!(records, 2);
    assert_eq!(
        qemus_of(&bundle),
        Vec::<String>::new(),
        "a bundle's QEMU outlived the run"
    );
    a_killed_run_takes_the_bundles_qemu_along(&host, &host_blklab, &fresh);
    assert_eq!(offline.calls(), "", "apt or a compiler was called");
}
