//! The comparison as text: the machine and the daemon measured, one line
//! per load and backend (means over the rounds, the rounds' spread), the
//! ratios to both qemu-storage-daemon setups, each daemon's idle CPU, and
//! the targets.

use std::fmt::Write as _;

use super::{Backend, Cell, CompareReport};
use crate::bench::verdict::tally;

/// A rate in few characters: `8574`, `612k`, `1.27M`.
fn short(x: f64) -> String {
    if x >= 1e7 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e4 {
        format!("{:.0}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// The rounds' spread, `lo-hi`.
fn spread((lo, hi): (f64, f64)) -> String {
    format!("{}-{}", short(lo), short(hi))
}

fn ratio(x: f64, y: f64) -> f64 {
    if y > 0.0 {
        x / y
    } else {
        f64::NAN
    }
}

impl CompareReport {
    /// The ratio table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "machine: {}\nqemu-storage-daemon: {}\npinning: {}\n\n",
            self.machine,
            self.qsd_version,
            self.pinning
                .as_deref()
                .unwrap_or("none (one CPU): QD1 rows unpinned")
        );
        let _ = writeln!(
            s,
            "{:<30} {:<22} {:>9} {:>13} {:>8} {:>8} {:>7} {:>10} {:>13} {:>6}",
            "load",
            "backend",
            "IOPS",
            "(rounds)",
            "p50 us",
            "p99 us",
            "CPU s",
            "IOPS/CPU-s",
            "(rounds)",
            "errors"
        );
        for rr in &self.rows {
            for (i, c) in rr.cells.iter().enumerate() {
                self.cell_lines(&mut s, if i == 0 { &rr.row.name } else { "" }, c, &rr.cells);
            }
        }
        self.idle_lines(&mut s);
        s += "\ntargets (ratios within this run):\n";
        for v in &self.verdicts {
            let val = if v.target.contains('%') {
                format!("{:+.1} %", v.value * 100.0)
            } else {
                format!("{:.2}", v.value)
            };
            let _ = writeln!(
                s,
                "  {:<88} {:>9}  (target {}) {}",
                v.what,
                val,
                v.target,
                if v.pass { "PASS" } else { "FAIL" }
            );
        }
        for k in &self.skipped {
            let _ = writeln!(
                s,
                "  {:<88} {:>9}  (target {}) SKIPPED: {}",
                k.what, "-", k.target, k.reason
            );
        }
        let _ = writeln!(s, "{}", tally(&self.verdicts, &self.skipped));
        s
    }

    /// A cell's line and its ratios to the daemon's setups in the same row.
    fn cell_lines(&self, s: &mut String, load: &str, c: &Cell, row: &[Cell]) {
        let _ = writeln!(
            s,
            "{:<30} {:<22} {:>9.0} {:>13} {:>8.1} {:>8.1} {:>7.2} {:>10.0} {:>13} {:>6}",
            load,
            c.backend.label(),
            c.iops,
            spread(c.iops_range),
            c.p50_ns / 1e3,
            c.p99_ns / 1e3,
            c.backend_cpu_s,
            c.iops_per_backend_cpu_s,
            spread(c.iops_per_cpu_range),
            c.errors
        );
        for base in [Backend::Qsd, Backend::QsdIothread] {
            let Some(b) = row.iter().find(|x| x.backend == base) else {
                continue;
            };
            if c.backend == base || (c.backend == Backend::Qsd && base == Backend::QsdIothread) {
                continue;
            }
            let _ = writeln!(
                s,
                "{:<30} {:<22} {:>8.2}x {:>13} {:>7.2}x {:>7.2}x {:>7} {:>9.2}x",
                "",
                format!(
                    "  ratio to {}",
                    if base == Backend::Qsd {
                        "qsd"
                    } else {
                        "iothread"
                    }
                ),
                ratio(c.iops, b.iops),
                "",
                ratio(c.p50_ns, b.p50_ns),
                ratio(c.p99_ns, b.p99_ns),
                "",
                ratio(c.iops_per_backend_cpu_s, b.iops_per_backend_cpu_s)
            );
        }
    }

    /// Each daemon's CPU with its disk idle.
    fn idle_lines(&self, s: &mut String) {
        if self.idle.is_empty() {
            return;
        }
        s.push_str("\nidle disk (connected, no I/O, after a short QD1 load):\n");
        for i in &self.idle {
            let _ = writeln!(
                s,
                "  {:<22} {:>8.3} % of one CPU ({} us of CPU in {:.1} s)",
                i.backend.label(),
                i.cpu.pct_of_cpu,
                i.cpu.cpu_ns / 1000,
                i.cpu.span_s
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{IdleCpu, IdleResult};
    use super::*;
    use crate::bench::{Skipped, Verdict};

    #[test]
    fn the_table_names_the_measured_daemon_the_pinning_and_the_idle_cpu() {
        let r = CompareReport {
            machine: "m".into(),
            qsd_version: "qemu-storage-daemon version 10.0.2".into(),
            pinning: None,
            rows: vec![],
            idle: vec![IdleResult {
                backend: Backend::BlklabAdaptive,
                cpu: IdleCpu {
                    cpu_ns: 1_234_000,
                    span_s: 2.0,
                    pct_of_cpu: 0.0617,
                },
            }],
            verdicts: vec![Verdict {
                what: "x".into(),
                value: 0.5,
                target: ">= 2.0".into(),
                pass: false,
            }],
            skipped: vec![Skipped {
                what: "y".into(),
                target: "< 1".into(),
                reason: "idle CPU was not measured (--idle-time off)".into(),
            }],
        };
        let t = r.table();
        assert!(
            t.contains("qemu-storage-daemon: qemu-storage-daemon version 10.0.2"),
            "{t}"
        );
        assert!(t.contains("pinning: none (one CPU)"), "{t}");
        let idle = t.lines().find(|l| l.contains("blklab adaptive")).unwrap();
        assert!(
            idle.ends_with(" 0.062 % of one CPU (1234 us of CPU in 2.0 s)"),
            "{t}"
        );
        assert!(t.contains("FAIL"), "{t}");
        // A target not judged is listed with its reason and counted apart.
        let y = t
            .lines()
            .find(|l| l.trim_start().starts_with("y "))
            .unwrap();
        assert!(
            y.ends_with("(target < 1) SKIPPED: idle CPU was not measured (--idle-time off)"),
            "{t}"
        );
        assert!(
            t.contains("targets: 0 passed, 1 failed, 1 skipped (not judged in this run)"),
            "{t}"
        );
    }

    #[test]
    fn rates_are_short() {
        assert_eq!(short(8574.4), "8574");
        assert_eq!(short(612_345.0), "612k");
        assert_eq!(short(1_270_633.0), "1.27M");
        assert_eq!(short(15_500_000.0), "15.5M");
        assert_eq!(spread((612_345.0, 1_270_633.0)), "612k-1.27M");
    }
}
