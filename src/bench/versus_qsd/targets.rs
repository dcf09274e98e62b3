//! The targets of a comparison, as ratios within its run: blklab against
//! qemu-storage-daemon in its main loop (notify mode and always-on
//! polling: IOPS per backend CPU-second at the throughput row, the QD1
//! round trip), adaptive polling against the daemon's IOThread (IOPS per
//! backend CPU-second at the throughput row, IOPS at QD1), the statistics'
//! cost, the polling client's round trip, and each blklab's idle CPU.
//! The set of targets is fixed: one whose side was not measured (an
//! option left it out) or whose denominator is zero is skipped, with why.

use super::{cell, Backend, Cell, CompareOpts, IdleResult, RowResult};
use crate::bench::{Skipped, Verdict};

/// The targets as judged: a [`Verdict`] each, or a [`Skipped`] with why
/// this run could not judge it. Every target is one or the other.
#[derive(Debug, Default)]
pub(super) struct Judged {
    pub verdicts: Vec<Verdict>,
    pub skipped: Vec<Skipped>,
}

impl Judged {
    fn skip(&mut self, what: String, target: &str, reason: String) {
        self.skipped.push(Skipped {
            what,
            target: target.into(),
            reason,
        });
    }

    /// `num / den - offset` as a verdict when `den` is positive; else
    /// skipped, naming `den_is` (what the denominator is).
    fn ratio(
        &mut self,
        what: String,
        (num, den, offset): (f64, f64, f64),
        (target, pass): (&str, fn(f64) -> bool),
        den_is: &str,
    ) {
        if den > 0.0 {
            let value = num / den - offset;
            self.verdicts.push(Verdict {
                what,
                value,
                target: target.into(),
                pass: pass(value),
            });
        } else {
            self.skip(what, target, format!("{den_is} is {den}: no ratio"));
        }
    }
}

/// Why `b` has no cell in a row: the option that left it out, or that
/// the row was not run.
fn not_measured(b: Backend) -> String {
    match b {
        Backend::BlklabPoll => format!("{} was not measured (--poll off)", b.label()),
        Backend::BlklabAdaptive => format!("{} was not measured (--adaptive off)", b.label()),
        _ => format!("{} was not measured", b.label()),
    }
}

/// The name of row `row`, or of the row the plan would have had there.
fn row_name(rows: &[RowResult], opts: &CompareOpts, row: usize) -> String {
    match rows.get(row) {
        Some(r) => r.row.name.clone(),
        None => super::row_names(&opts.shape)[row].clone(),
    }
}

/// A cell's figure a target is stated in.
type Metric = fn(&Cell) -> f64;

/// A ratio target: (row, metric's name, the metric, target, test).
type Target = (usize, &'static str, Metric, &'static str, fn(f64) -> bool);

/// `get(b) / get(base)` for each of `backends` in each target's row.
fn versus(
    j: &mut Judged,
    rows: &[RowResult],
    opts: &CompareOpts,
    base: Backend,
    backends: &[Backend],
    targets: &[Target],
) {
    for &(row, metric, get, target, pass) in targets {
        for &b in backends {
            let what = format!(
                "{}: {metric}, {} / {}",
                row_name(rows, opts, row),
                b.label(),
                base.label()
            );
            match (cell(rows, row, base), cell(rows, row, b)) {
                (Some(q), Some(c)) => j.ratio(
                    what,
                    (get(c), get(q), 0.0),
                    (target, pass),
                    &format!("{}'s {metric}", base.label()),
                ),
                (None, _) => j.skip(what, target, not_measured(base)),
                (_, None) => j.skip(what, target, not_measured(b)),
            }
        }
    }
}

/// The blklab setups whose idle CPU is held to a target.
const IDLE_JUDGED: [Backend; 4] = [
    Backend::Blklab,
    Backend::BlklabNoStats,
    Backend::BlklabAdaptive,
    Backend::BlklabPoll,
];

/// The targets as ratios within this run; `idle` is `None` when idle CPU
/// was not measured.
pub(super) fn verdicts(
    rows: &[RowResult],
    idle: Option<&[IdleResult]>,
    opts: &CompareOpts,
) -> Judged {
    let mut j = Judged::default();
    versus(
        &mut j,
        rows,
        opts,
        Backend::Qsd,
        &[Backend::Blklab, Backend::BlklabPoll],
        &[
            (
                0,
                "IOPS per backend CPU-second",
                |c| c.iops_per_backend_cpu_s,
                ">= 2.0",
                |r| r >= 2.0,
            ),
            (1, "round trip p50", |c| c.p50_ns, "<= 0.8", |r| r <= 0.8),
        ],
    );
    versus(
        &mut j,
        rows,
        opts,
        Backend::QsdIothread,
        &[Backend::BlklabAdaptive],
        &[
            (
                0,
                "IOPS per backend CPU-second",
                |c| c.iops_per_backend_cpu_s,
                ">= 2.0",
                |r| r >= 2.0,
            ),
            (1, "IOPS", |c| c.iops, ">= 1.5", |r| r >= 1.5),
        ],
    );
    statistics(&mut j, rows, opts);
    let what = format!(
        "{}: blklab --poll round trip p50, us",
        row_name(rows, opts, 2)
    );
    match cell(rows, 2, Backend::BlklabPoll) {
        Some(p) => {
            let us = p.p50_ns / 1e3;
            j.verdicts.push(Verdict {
                what,
                value: us,
                target: "<= 3".into(),
                pass: us <= 3.0,
            });
        }
        None => j.skip(what, "<= 3", not_measured(Backend::BlklabPoll)),
    }
    for b in IDLE_JUDGED {
        let what = format!("idle disk: {} CPU, % of one CPU", b.label());
        match idle.map(|idle| idle.iter().find(|i| i.backend == b)) {
            Some(Some(i)) => j.verdicts.push(Verdict {
                what,
                value: i.cpu.pct_of_cpu,
                target: "< 1".into(),
                pass: i.cpu.pct_of_cpu < 1.0,
            }),
            Some(None) => j.skip(what, "< 1", not_measured(b)),
            None => j.skip(
                what,
                "< 1",
                "idle CPU was not measured (--idle-time off)".into(),
            ),
        }
    }
    j
}

/// Statistics on against `--no-stats` at the throughput row.
fn statistics(j: &mut Judged, rows: &[RowResult], opts: &CompareOpts) {
    let within_3: fn(f64) -> bool = |r: f64| r.abs() <= 0.03;
    let name = row_name(rows, opts, 0);
    let metrics: [(&str, Metric); 2] = [
        ("IOPS per backend CPU-second", |c| c.iops_per_backend_cpu_s),
        ("IOPS", |c| c.iops),
    ];
    let cells = (
        cell(rows, 0, Backend::Blklab),
        cell(rows, 0, Backend::BlklabNoStats),
    );
    for (metric, get) in metrics {
        let what = format!("{name}: statistics on vs --no-stats, {metric}");
        let den_is = format!("{}'s {metric}", Backend::BlklabNoStats.label());
        match cells {
            (Some(b), Some(n)) => j.ratio(
                what,
                (get(b), get(n), 1.0),
                ("within 3 %", within_3),
                &den_is,
            ),
            (None, _) => j.skip(what, "within 3 %", not_measured(Backend::Blklab)),
            (_, None) => j.skip(what, "within 3 %", not_measured(Backend::BlklabNoStats)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{test_opts, IdleCpu, Row};
    use super::*;

    fn cell(backend: Backend, iops: f64, per_cpu: f64, p50_ns: f64) -> Cell {
        Cell {
            backend,
            requests: 1,
            errors: 0,
            seconds: 1.0,
            backend_cpu_s: 1.0,
            iops,
            iops_per_backend_cpu_s: per_cpu,
            p50_ns,
            p99_ns: p50_ns * 2.0,
            iops_range: (iops, iops),
            iops_per_cpu_range: (per_cpu, per_cpu),
            rounds: Vec::new(),
        }
    }

    fn row(name: &str, depth: usize, client_poll: bool, cells: Vec<Cell>) -> RowResult {
        RowResult {
            row: Row {
                name: name.into(),
                depth,
                client_poll,
                pinned: depth == 1,
                backends: cells.iter().map(|c| c.backend).collect(),
            },
            cells,
        }
    }

    fn find<'a>(v: &'a [Verdict], what: &str) -> &'a Verdict {
        v.iter()
            .find(|x| x.what.contains(what))
            .unwrap_or_else(|| panic!("no verdict {what:?} in {v:#?}"))
    }

    fn idle(backend: Backend, pct: f64) -> IdleResult {
        IdleResult {
            backend,
            cpu: IdleCpu {
                cpu_ns: (pct * 2e7) as u64,
                span_s: 2.0,
                pct_of_cpu: pct,
            },
        }
    }

    #[test]
    fn verdicts_are_the_ratios_against_their_targets() {
        let rows = vec![
            row(
                "randread qd64",
                64,
                false,
                vec![
                    cell(Backend::Qsd, 100.0, 1000.0, 50_000.0),
                    cell(Backend::QsdIothread, 110.0, 900.0, 45_000.0),
                    cell(Backend::Blklab, 150.0, 2100.0, 40_000.0),
                    cell(Backend::BlklabNoStats, 160.0, 2200.0, 40_000.0),
                    cell(Backend::BlklabAdaptive, 300.0, 1700.0, 20_000.0),
                    cell(Backend::BlklabPoll, 200.0, 1900.0, 30_000.0),
                ],
            ),
            row(
                "randread qd1",
                1,
                false,
                vec![
                    cell(Backend::Qsd, 10.0, 10.0, 100_000.0),
                    cell(Backend::QsdIothread, 20.0, 10.0, 50_000.0),
                    cell(Backend::Blklab, 10.0, 10.0, 85_000.0),
                    cell(Backend::BlklabAdaptive, 29.0, 10.0, 30_000.0),
                    cell(Backend::BlklabPoll, 10.0, 10.0, 8_000.0),
                ],
            ),
            row(
                "randread qd1 poll-client",
                1,
                true,
                vec![
                    cell(Backend::Qsd, 10.0, 10.0, 20_000.0),
                    cell(Backend::BlklabPoll, 10.0, 10.0, 3_500.0),
                ],
            ),
        ];
        let idles = [
            idle(Backend::Qsd, 0.0),
            idle(Backend::Blklab, 0.01),
            idle(Backend::BlklabNoStats, 0.01),
            idle(Backend::BlklabAdaptive, 0.4),
            idle(Backend::BlklabPoll, 1.5),
        ];
        let j = verdicts(&rows, Some(&idles[..]), &test_opts(true, true));
        let v = j.verdicts;
        assert_eq!(v.len(), 13, "{v:#?}");
        assert!(j.skipped.is_empty(), "{:#?}", j.skipped);
        let t = find(&v, "qd64: IOPS per backend CPU-second, blklab / ");
        assert!((t.value - 2.1).abs() < 1e-9 && t.pass, "{t:?}");
        let t = find(&v, "qd64: IOPS per backend CPU-second, blklab --poll /");
        assert!((t.value - 1.9).abs() < 1e-9 && !t.pass, "{t:?}");
        let t = find(&v, "qd1: round trip p50, blklab / ");
        assert!((t.value - 0.85).abs() < 1e-9 && !t.pass, "{t:?}");
        let t = find(&v, "qd1: round trip p50, blklab --poll /");
        assert!((t.value - 0.08).abs() < 1e-9 && t.pass, "{t:?}");
        // Adaptive polling is held to the daemon's IOThread.
        let t = find(
            &v,
            "qd64: IOPS per backend CPU-second, blklab adaptive / qsd iothread",
        );
        assert!((t.value - 1700.0 / 900.0).abs() < 1e-9 && !t.pass, "{t:?}");
        let t = find(&v, "qd1: IOPS, blklab adaptive / qsd iothread");
        assert!((t.value - 1.45).abs() < 1e-9 && !t.pass, "{t:?}");
        // 2100 / 2200 - 1 = -4.5 %: outside 3 %.
        let t = find(&v, "statistics on vs --no-stats, IOPS per backend");
        assert!((t.value - (2100.0 / 2200.0 - 1.0)).abs() < 1e-9 && !t.pass);
        // 150 / 160 - 1 = -6.25 %.
        let t = find(&v, "statistics on vs --no-stats, IOPS");
        assert!(!t.pass);
        let t = find(&v, "blklab --poll round trip p50, us");
        assert!((t.value - 3.5).abs() < 1e-9 && !t.pass, "{t:?}");
        // Each blklab's idle CPU; the daemon's is shown, not judged.
        assert!(find(&v, "idle disk: blklab adaptive").pass);
        assert!(!find(&v, "idle disk: blklab --poll").pass);
        assert!(!v.iter().any(|x| x.what.contains("idle disk: qemu")));
    }

    #[test]
    fn a_missing_side_or_a_zero_denominator_is_skipped_never_passed() {
        let rows = vec![row(
            "randread qd64",
            64,
            false,
            vec![
                cell(Backend::Qsd, 100.0, 0.0, 50_000.0),
                cell(Backend::Blklab, 150.0, 2100.0, 40_000.0),
                cell(Backend::BlklabNoStats, 150.0, 0.0, 40_000.0),
                cell(Backend::BlklabAdaptive, 150.0, 2100.0, 40_000.0),
            ],
        )];
        // Polling rows and idle CPU off: every target is still accounted
        // for, as a verdict or a skip with its reason.
        let j = verdicts(&rows, None, &test_opts(false, false));
        assert_eq!(j.verdicts.len() + j.skipped.len(), 13, "{j:#?}");
        let skipped = |what: &str| {
            j.skipped
                .iter()
                .find(|s| s.what.contains(what))
                .unwrap_or_else(|| panic!("{what:?} not skipped: {j:#?}"))
        };
        // The only verdict: the statistics' IOPS, which has its cells.
        assert_eq!(j.verdicts.len(), 1, "{:#?}", j.verdicts);
        assert!(j.verdicts[0]
            .what
            .contains("statistics on vs --no-stats, IOPS"));
        // qemu-storage-daemon's IOPS per CPU-second is 0: no ratio.
        let s = skipped("qd64: IOPS per backend CPU-second, blklab / ");
        assert_eq!(
            s.reason,
            "qemu-storage-daemon's IOPS per backend CPU-second is 0: no ratio"
        );
        assert_eq!(s.target, ">= 2.0");
        assert_eq!(
            skipped("qd64: IOPS per backend CPU-second, blklab --poll /").reason,
            "blklab --poll was not measured (--poll off)"
        );
        // A row the plan left out is named as the plan would have.
        assert_eq!(
            skipped("randread qd1 poll-client: blklab --poll round trip p50").reason,
            "blklab --poll was not measured (--poll off)"
        );
        assert_eq!(
            skipped("randread qd1: round trip p50, blklab / ").reason,
            "qemu-storage-daemon was not measured"
        );
        assert_eq!(
            skipped("qd64: IOPS per backend CPU-second, blklab adaptive / qsd iothread").reason,
            "qsd iothread was not measured"
        );
        assert_eq!(
            skipped("statistics on vs --no-stats, IOPS per backend CPU-second").reason,
            "blklab --no-stats's IOPS per backend CPU-second is 0: no ratio"
        );
        assert_eq!(
            skipped("idle disk: blklab CPU").reason,
            "idle CPU was not measured (--idle-time off)"
        );
        // Idle CPU measured, but not of a backend the run left out.
        let idles = [idle(Backend::Blklab, 0.01)];
        let j = verdicts(&rows, Some(&idles[..]), &test_opts(true, false));
        assert!(j
            .verdicts
            .iter()
            .any(|v| v.what == "idle disk: blklab CPU, % of one CPU"));
        let s = j
            .skipped
            .iter()
            .find(|s| s.what == "idle disk: blklab --poll CPU, % of one CPU")
            .unwrap();
        assert_eq!(s.reason, "blklab --poll was not measured (--poll off)");
    }
}
