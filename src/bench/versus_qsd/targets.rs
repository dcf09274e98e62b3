//! The targets of a comparison, as ratios within its run: blklab against
//! qemu-storage-daemon in its main loop (notify mode and always-on
//! polling: IOPS per backend CPU-second at the throughput row, the QD1
//! round trip), adaptive polling against the daemon's IOThread (IOPS per
//! backend CPU-second at the throughput row, IOPS at QD1), the statistics'
//! cost, the polling client's round trip, and each blklab's idle CPU.

use super::{cell, Backend, Cell, IdleResult, RowResult};
use crate::bench::Verdict;

/// `num / den - offset` as a verdict, when `den` is positive.
fn push_ratio(
    v: &mut Vec<Verdict>,
    what: String,
    (num, den, offset): (f64, f64, f64),
    target: &str,
    pass: fn(f64) -> bool,
) {
    if den > 0.0 {
        let value = num / den - offset;
        v.push(Verdict {
            what,
            value,
            target: target.into(),
            pass: pass(value),
        });
    }
}

/// A ratio target: (row, metric's name, the metric, target, test).
type Target = (
    usize,
    &'static str,
    fn(&Cell) -> f64,
    &'static str,
    fn(f64) -> bool,
);

/// `get(b) / get(base)` for each of `backends` in each target's row.
fn versus(
    v: &mut Vec<Verdict>,
    rows: &[RowResult],
    base: Backend,
    backends: &[Backend],
    targets: &[Target],
) {
    for &(row, metric, get, target, pass) in targets {
        for &b in backends {
            if let (Some(q), Some(c)) = (cell(rows, row, base), cell(rows, row, b)) {
                push_ratio(
                    v,
                    format!(
                        "{}: {metric}, {} / {}",
                        rows[row].row.name,
                        b.label(),
                        base.label()
                    ),
                    (get(c), get(q), 0.0),
                    target,
                    pass,
                );
            }
        }
    }
}

/// The targets as ratios within this run.
pub(super) fn verdicts(rows: &[RowResult], idle: &[IdleResult]) -> Vec<Verdict> {
    let mut v = Vec::new();
    versus(
        &mut v,
        rows,
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
        &mut v,
        rows,
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
    statistics(&mut v, rows);
    if let Some(p) = cell(rows, 2, Backend::BlklabPoll) {
        let us = p.p50_ns / 1e3;
        v.push(Verdict {
            what: format!("{}: blklab --poll round trip p50, us", rows[2].row.name),
            value: us,
            target: "<= 3".into(),
            pass: us <= 3.0,
        });
    }
    for i in idle.iter().filter(|i| !i.backend.is_qsd()) {
        v.push(Verdict {
            what: format!("idle disk: {} CPU, % of one CPU", i.backend.label()),
            value: i.cpu.pct_of_cpu,
            target: "< 1".into(),
            pass: i.cpu.pct_of_cpu < 1.0,
        });
    }
    v
}

/// Statistics on against `--no-stats` at the throughput row.
fn statistics(v: &mut Vec<Verdict>, rows: &[RowResult]) {
    let within_3 = |r: f64| r.abs() <= 0.03;
    if let (Some(b), Some(n)) = (
        cell(rows, 0, Backend::Blklab),
        cell(rows, 0, Backend::BlklabNoStats),
    ) {
        push_ratio(
            v,
            format!(
                "{}: statistics on vs --no-stats, IOPS per backend CPU-second",
                rows[0].row.name
            ),
            (b.iops_per_backend_cpu_s, n.iops_per_backend_cpu_s, 1.0),
            "within 3 %",
            within_3,
        );
        push_ratio(
            v,
            format!("{}: statistics on vs --no-stats, IOPS", rows[0].row.name),
            (b.iops, n.iops, 1.0),
            "within 3 %",
            within_3,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::{IdleCpu, Row};
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
            idle(Backend::BlklabAdaptive, 0.4),
            idle(Backend::BlklabPoll, 1.5),
        ];
        let v = verdicts(&rows, &idles);
        assert_eq!(v.len(), 12, "{v:#?}");
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
    fn a_missing_or_zero_denominator_gives_no_verdict() {
        let rows = vec![row(
            "randread qd64",
            64,
            false,
            vec![
                cell(Backend::Qsd, 100.0, 0.0, 50_000.0),
                cell(Backend::Blklab, 150.0, 2100.0, 40_000.0),
                cell(Backend::BlklabAdaptive, 150.0, 2100.0, 40_000.0),
            ],
        )];
        let v = verdicts(&rows, &[]);
        assert!(v.is_empty(), "{v:#?}");
    }
}
