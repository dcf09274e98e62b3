//! What differs between the sides' setups besides the conditions of the
//! contract: the QEMU command lines (each condition in them is checked on
//! its own, see [`super::Condition`]), the host and its cores (the vCPUs
//! that could run at once are a condition). Shown in every report, never
//! blocking.

use super::check::Difference;
use super::{boot_dirs_named, json_text};
use crate::record::result::ResultRecord;
use crate::report::load::Side;

/// The QEMU command line with what is per kernel or per boot replaced.
fn qemu_identity(r: &ResultRecord) -> String {
    let args = &r.qemu_command_line;
    let mut out = Vec::new();
    let mut skip_next = false;
    for (i, a) in args.iter().enumerate() {
        if skip_next {
            skip_next = false;
            out.push("…".to_string());
            continue;
        }
        if i == 0 {
            out.push("qemu".into());
            continue;
        }
        if a == "-kernel" || a == "-initrd" {
            skip_next = true;
        }
        if a.starts_with("socket,id=") {
            out.push(a.split(",path=").next().unwrap_or(a).to_string());
            continue;
        }
        out.push(boot_dirs_named(a));
    }
    out.join(" ")
}

/// A side's distinct QEMU command lines (per-boot paths named, see
/// [`qemu_identity`]), sorted: one per machine its scenarios pin.
fn qemu_lines(records: &[ResultRecord]) -> Vec<String> {
    let mut v: Vec<String> = records.iter().map(qemu_identity).collect();
    v.sort();
    v.dedup();
    v
}

/// How the sides' QEMU command lines differ: the lines only A has, and
/// the lines only B has; `None` when they have the same.
fn qemu_difference(a: &[ResultRecord], b: &[ResultRecord]) -> Option<(String, String)> {
    let (la, lb) = (qemu_lines(a), qemu_lines(b));
    if la == lb {
        return None;
    }
    let only = |x: &[String], y: &[String]| -> String {
        let v: Vec<&str> = x
            .iter()
            .filter(|l| !y.contains(l))
            .map(String::as_str)
            .collect();
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(" | ")
        }
    };
    Some((only(&la, &lb), only(&lb, &la)))
}

/// What differs between the sides' setups that is not a condition of the
/// contract, shown and never blocking: the QEMU command lines, the host and
/// its cores.
pub(crate) fn setup_differences(a: &Side, b: &Side) -> Vec<Difference> {
    let mut d = Vec::new();
    let mut show = |what: &str, va: String, vb: String| {
        if va != vb {
            d.push(Difference {
                what: what.to_string(),
                condition: None,
                a: va,
                b: vb,
                blocking: false,
                by_design: false,
                within: None,
                rows: Vec::new(),
            });
        }
    };
    if let Some((va, vb)) = qemu_difference(&a.records, &b.records) {
        show("QEMU command line", va, vb);
    }
    show("host", json_text(&a.run.host), json_text(&b.run.host));
    let cores = |s: &Side| {
        s.run
            .parallelism
            .as_ref()
            .map_or("(not recorded)".to_string(), |p| p.describe())
    };
    show("host cores", cores(a), cores(b));
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::test_record;
    use serde_json::json;

    #[test]
    fn boot_directories_are_not_a_difference_options_are() {
        let r = |cl: serde_json::Value| test_record(json!({ "qemu_command_line": cl }));
        let plugin = |dir: &str| format!("/c/libblklab-insns.so,ctl={dir}/insns.sock");
        let a = r(json!([
            "qemu",
            "-plugin",
            plugin("/tmp/blklab-run-0-Ab3xYz"),
            "-m",
            "1G"
        ]));
        let b = r(json!([
            "qemu",
            "-plugin",
            plugin("/tmp/blklab-run-1-Qw9eRt"),
            "-m",
            "1G"
        ]));
        assert_eq!(qemu_identity(&a), qemu_identity(&b));
        assert!(qemu_identity(&a).contains("ctl=…/blklab-run-…/insns.sock"));
        // Another temporary directory ($TMPDIR) is no difference either.
        let elsewhere = r(json!([
            "qemu",
            "-plugin",
            plugin("/scratch/t/blklab-run-7-Zz0aB1"),
            "-m",
            "1G"
        ]));
        assert_eq!(qemu_identity(&a), qemu_identity(&elsewhere));
        // A value is.
        let c = r(json!([
            "qemu",
            "-plugin",
            plugin("/tmp/blklab-run-1-Qw9eRt"),
            "-m",
            "2G"
        ]));
        assert_ne!(qemu_identity(&a), qemu_identity(&c));
        // A different plugin or socket name outside the boot directory is
        // a real difference.
        let d = r(json!([
            "qemu",
            "-plugin",
            "/c/other.so,ctl=/tmp/blklab-run-2-Zx/insns.sock",
            "-m",
            "1G"
        ]));
        assert_ne!(qemu_identity(&a), qemu_identity(&d));
        let e = r(json!([
            "qemu",
            "-plugin",
            plugin("/tmp/blklab-run-2-Zx").replace("insns.sock", "other.sock"),
            "-m",
            "1G"
        ]));
        assert_ne!(qemu_identity(&a), qemu_identity(&e));
    }

    #[test]
    fn the_sides_differ_only_in_options_devices_and_values() {
        let r = |dir: &str, extra: &[&str]| {
            let mut cl = vec![
                "qemu".to_string(),
                "-qmp".into(),
                format!("unix:{dir}/qmp.sock,server=on,wait=off"),
                "-kernel".into(),
                format!("/cache/{dir}/vmlinuz"),
                "-chardev".into(),
                format!("socket,id=blklab0,path={dir}/vd.sock"),
            ];
            cl.extend(extra.iter().map(|s| s.to_string()));
            test_record(json!({ "qemu_command_line": cl }))
        };
        let dev = |q: u32| format!("vhost-user-blk-pci,chardev=blklab0,num-queues={q}");
        let d2 = dev(2);
        let base = ["-smp", "2", "-device", d2.as_str()];
        let a = vec![r("/tmp/blklab-run-0-aaaaaa", &base)];
        let b = vec![r("/var/tmp/blklab-run-1-bbbbbb", &base)];
        assert_eq!(qemu_difference(&a, &b), None, "per-run paths only");
        // Two machines per side (two scenarios), in any order: the same.
        let one = ["-smp", "1", "-device", "x"];
        let a2 = vec![a[0].clone(), r("/tmp/blklab-run-2-cccccc", &one)];
        let b2 = vec![r("/tmp/blklab-run-3-dddddd", &one), b[0].clone()];
        assert_eq!(qemu_difference(&a2, &b2), None, "the same machines");
        // An option, a device and a value stay visible.
        let option = vec![r(
            "/tmp/blklab-run-1-bbbbbb",
            &[&base[..], &["-no-hpet"]].concat(),
        )];
        let (_, vb) = qemu_difference(&a, &option).unwrap();
        assert!(vb.ends_with("-no-hpet"), "{vb}");
        let d4 = dev(4);
        let device = vec![r(
            "/tmp/blklab-run-1-bbbbbb",
            &["-smp", "2", "-device", &d4],
        )];
        let (va, vb) = qemu_difference(&a, &device).unwrap();
        assert!(
            va.contains("num-queues=2") && vb.contains("num-queues=4"),
            "{va} | {vb}"
        );
        let value = vec![r(
            "/tmp/blklab-run-1-bbbbbb",
            &["-smp", "4", "-device", &d2],
        )];
        let (va, vb) = qemu_difference(&a, &value).unwrap();
        assert!(
            va.contains("-smp 2") && vb.contains("-smp 4"),
            "{va} | {vb}"
        );
        assert!(!va.contains("blklab-run-0"), "{va}");
    }
}
