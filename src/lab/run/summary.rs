//! The table `blklab run` prints: per scenario variant and kernel, the mean
//! and spread of the headline metrics over iterations. Given the run's
//! boots (run.json's `order`), a planned variant run that left no record
//! is counted as not run in its row ([`rows_planned`], [`table_planned`]),
//! never taken for one that ran.

use std::collections::BTreeMap;
use std::path::Path;

use crate::lab::run::error::RunError;
use crate::record::result::ResultRecord;
use crate::record::run::BootOrder;
use crate::record::summary::{RetriedBoot, RetriedHost, SummaryDocument, SUMMARY_SCHEMA};
pub(crate) use crate::record::summary::{Row, Stat};

/// The metrics of the summary, in column order: (key, header).
pub(crate) const METRICS: &[(&str, &str)] = &[
    ("iops", "IOPS"),
    ("guest_busy_pct", "guest busy%"),
    ("guest_sys_pct", "sys%"),
    ("guest_soft_pct", "soft%"),
    ("ctxsw_per_io", "cs/IO"),
    ("irqs_per_io", "irq/IO"),
    ("requests_per_kick", "req/kick"),
    ("host_vcpu_pct", "host vCPU%"),
    ("host_backend_pct", "backend%"),
];

/// One record's metrics (missing ones are left out).
pub(crate) fn metrics(r: &ResultRecord) -> BTreeMap<&'static str, f64> {
    let mut m = BTreeMap::new();
    let g = &r.guest;
    if let Some(v) = crate::record::metrics::iops(r) {
        m.insert("iops", v);
    }
    if let Some(cpu) = &g.cpu {
        m.insert("guest_busy_pct", cpu.all.busy);
        m.insert("guest_sys_pct", cpu.all.sys);
        m.insert("guest_soft_pct", cpu.all.soft);
    }
    let ios = crate::record::metrics::ios(r);
    if let (Some(cs), Some(n)) = (g.context_switches, ios) {
        m.insert("ctxsw_per_io", cs as f64 / n);
    }
    if let (Some(irq), Some(n)) = (&g.interrupts, ios) {
        m.insert("irqs_per_io", irq.total as f64 / n);
    }
    if let Some(b) = &r.backend {
        let (req, kicks) = (b.sum(|c| c.requests), b.sum(|c| c.kicks));
        if kicks > 0 {
            m.insert("requests_per_kick", req as f64 / kicks as f64);
        }
    }
    if let Some(h) = &r.host {
        if let Some(v) = h
            .qemu
            .as_ref()
            .and_then(|q| q.groups.get("vcpu"))
            .map(|g| g.percent_of_one_cpu)
        {
            m.insert("host_vcpu_pct", v);
        }
        if let Some(v) = h.group_sum("blklab", "backend", |g| g.percent_of_one_cpu) {
            m.insert("host_backend_pct", v);
        }
    }
    m
}

fn stat(v: &[f64]) -> Stat {
    let n = v.len();
    let mean = v.iter().sum::<f64>() / n.max(1) as f64;
    let sd = if n > 1 {
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    Stat { n, mean, sd }
}

/// The boots of the run in `out_dir` (its run.json's `order`); none when
/// run.json cannot be read.
pub fn run_order(out_dir: &Path) -> Vec<BootOrder> {
    crate::record::read::<crate::record::run::RunDocument>(&out_dir.join("run.json"))
        .map(|d| d.order)
        .unwrap_or_default()
}

/// A planned variant run: (kernel, scenario, variant, iteration).
type Case = (String, String, String, u32);

/// The variant runs `order` plans, in its order (a boot of an older
/// run.json, without its variants, plans none that can be told).
fn planned(order: &[BootOrder]) -> Vec<Case> {
    order
        .iter()
        .flat_map(|b| {
            b.variants
                .iter()
                .map(|v| (b.kernel.clone(), b.scenario.clone(), v.clone(), b.iteration))
        })
        .collect()
}

/// The variant runs `order` plans that left no record in `records`, in
/// plan order: `KERNEL SCENARIO/VARIANT #ITERATION` each.
pub fn not_run(order: &[BootOrder], records: &[ResultRecord]) -> Vec<String> {
    planned(order)
        .into_iter()
        .filter(|(k, s, v, i)| {
            !records
                .iter()
                .any(|r| r.kernel == *k && r.scenario == *s && r.variant == *v && r.iteration == *i)
        })
        .map(|(k, s, v, i)| format!("{k} {s}/{v} #{i}"))
        .collect()
}

/// Rows in first-seen order of (scenario, variant), kernels in run order.
pub fn rows(records: &[ResultRecord]) -> Vec<Row> {
    rows_planned(records, &[])
}

/// [`rows`], with every (scenario, variant, kernel) that `order` (the
/// run's boots) plans: each planned iteration without a record is
/// counted in its row's `not_run`, and a row none of whose iterations
/// left a record is listed with its count.
pub fn rows_planned(records: &[ResultRecord], order: &[BootOrder]) -> Vec<Row> {
    let mut order_seen: Vec<(String, String, String)> = Vec::new();
    let mut groups: BTreeMap<(String, String, String), Vec<&ResultRecord>> = BTreeMap::new();
    let mut missing: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for r in records {
        let key = (r.scenario.clone(), r.variant.clone(), r.kernel.clone());
        if !groups.contains_key(&key) {
            order_seen.push(key.clone());
        }
        groups.entry(key).or_default().push(r);
    }
    for (k, s, v, i) in planned(order) {
        let key = (s, v, k);
        let recorded = groups
            .get(&key)
            .is_some_and(|rs| rs.iter().any(|r| r.iteration == i));
        if !recorded {
            if !order_seen.contains(&key) {
                order_seen.push(key.clone());
            }
            *missing.entry(key).or_default() += 1;
        }
    }
    // Group rows of the same scenario/variant together.
    let mut sorted: Vec<(String, String, String)> = Vec::new();
    for k in &order_seen {
        if sorted.contains(k) {
            continue;
        }
        for k2 in order_seen.iter().filter(|k2| k2.0 == k.0 && k2.1 == k.1) {
            sorted.push(k2.clone());
        }
    }
    sorted
        .into_iter()
        .map(|k| {
            let recs: &[&ResultRecord] = groups.get(&k).map_or(&[], Vec::as_slice);
            let ok: Vec<&&ResultRecord> = recs.iter().filter(|r| r.ok).collect();
            let mut metrics = BTreeMap::new();
            for (key, _) in METRICS {
                let v: Vec<f64> = ok
                    .iter()
                    .filter_map(|r| self::metrics(r).get(key).copied())
                    .collect();
                if !v.is_empty() {
                    metrics.insert(key.to_string(), stat(&v));
                }
            }
            Row {
                iterations: recs.len(),
                failed: recs.len() - ok.len(),
                not_run: missing.get(&k).copied().unwrap_or(0),
                scenario: k.0,
                variant: k.1,
                kernel: k.2,
                metrics,
            }
        })
        .collect()
}

fn fmt(s: Option<&Stat>) -> String {
    match s {
        None => "-".into(),
        Some(s) => {
            let prec = if s.mean.abs() >= 100.0 {
                0
            } else if s.mean.abs() >= 10.0 {
                1
            } else {
                2
            };
            if s.n > 1 {
                format!("{:.*}±{:.*}", prec, s.mean, prec, s.sd)
            } else {
                format!("{:.*}", prec, s.mean)
            }
        }
    }
}

/// The plain-text table (mean±sd over iterations) of [`rows_planned`]: a
/// row's planned iterations that left no record show as `not run` in its
/// `n`, and a last line counts them and names each.
pub fn table_planned(records: &[ResultRecord], order: &[BootOrder]) -> String {
    let rows = rows_planned(records, order);
    let mut header = vec!["scenario/variant".to_string(), "kernel".into(), "n".into()];
    header.extend(METRICS.iter().map(|(_, h)| h.to_string()));
    let mut cells: Vec<Vec<String>> = vec![header];
    for r in &rows {
        let mut apart = Vec::new();
        if r.failed > 0 {
            apart.push(format!("{} failed", r.failed));
        }
        if r.not_run > 0 {
            apart.push(format!("{} not run", r.not_run));
        }
        let mut line = vec![
            format!("{}/{}", r.scenario, r.variant),
            r.kernel.clone(),
            if apart.is_empty() {
                r.iterations.to_string()
            } else {
                format!("{} ({})", r.iterations, apart.join(", "))
            },
        ];
        line.extend(METRICS.iter().map(|(k, _)| fmt(r.metrics.get(*k))));
        cells.push(line);
    }
    let (lines, widths) = crate::util::text::aligned_lines(&cells, |_, i| i < 2);
    let mut out = String::new();
    for (n, line) in lines.iter().enumerate() {
        out.push_str(line);
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
            out.push('\n');
        }
    }
    out.push_str(
        "mean±sd over iterations; guest CPU as mpstat (busy = 100 - idle); host % of one CPU\n",
    );
    let missing = not_run(order, records);
    if !missing.is_empty() {
        out.push_str(&format!(
            "not run: {} of {} planned variant runs left no record: {}\n",
            missing.len(),
            planned(order).len(),
            missing.join(", ")
        ));
    }
    out
}

/// summary.json and summary.txt: the table of every record, the failed
/// variants, the retried boots and the replaced nested hosts.
pub(crate) fn write(
    out_dir: &Path,
    records: &[ResultRecord],
    failures: &[String],
    retried: Vec<RetriedBoot>,
    retried_hosts: Vec<RetriedHost>,
) -> Result<(), RunError> {
    // The planned variant runs that left no record are counted as not run.
    let order = run_order(out_dir);
    let sum_doc = SummaryDocument {
        schema: SUMMARY_SCHEMA.to_string(),
        finished_unix: crate::util::wallclock::unix_now(),
        failures: failures.to_vec(),
        retried_boots: retried,
        retried_hosts,
        rows: rows_planned(records, &order),
    };
    crate::record::write(&out_dir.join("summary.json"), &sum_doc)?;
    let txt = out_dir.join("summary.txt");
    std::fs::write(&txt, table_planned(records, &order))
        .map_err(|source| RunError::Write { path: txt, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::{test_cpu_all, test_record};
    use serde_json::json;

    /// The table of records with nothing planned beyond them.
    fn table(records: &[ResultRecord]) -> String {
        table_planned(records, &[])
    }

    fn rec(kernel: &str, busy: f64, iops: f64) -> ResultRecord {
        test_record(json!({
            "kernel": kernel, "scenario": "s", "variant": "v", "ok": true,
            "checks": {"fio_ios": 1000},
            "guest": {"fio": {"jobs": [{"read": {"iops": iops}, "write": {"iops": 0.0}}]},
                      "cpu": {"all": test_cpu_all(busy, 1.0, 0.5)},
                      "context_switches": 2000, "interrupts": {"total": 500}},
            "backend": {"disks": [{"queues": [{"counters": {"requests": 1000, "kicks": 250}}]}]},
            "host": {"qemu": {"groups": {"vcpu": {"percent_of_one_cpu": 150.0}}},
                     "blklab": {"groups": {"backend-queues": {"percent_of_one_cpu": 20.0}, "lab": {"percent_of_one_cpu": 1.0}}}}
        }))
    }

    #[test]
    fn means_and_table() {
        let recs = vec![
            rec("A", 10.0, 100.0),
            rec("B", 20.0, 90.0),
            rec("A", 12.0, 110.0),
        ];
        let rows = rows(&recs);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].kernel, "A");
        let busy = &rows[0].metrics["guest_busy_pct"];
        assert_eq!((busy.n, busy.mean), (2, 11.0));
        assert!((busy.sd - 2f64.sqrt()).abs() < 1e-9);
        let m = metrics(&recs[0]);
        assert_eq!(m["ctxsw_per_io"], 2.0);
        assert_eq!(m["irqs_per_io"], 0.5);
        assert_eq!(m["requests_per_kick"], 4.0);
        assert_eq!(m["host_vcpu_pct"], 150.0);
        assert_eq!(m["host_backend_pct"], 20.0);
        let t = table(&recs);
        assert!(t.contains("s/v"), "{t}");
        assert!(t.contains("11.0±1.4"), "{t}");
        assert!(rows.iter().all(|r| r.not_run == 0));
        assert!(!t.contains("not run"), "{t}");
    }

    fn boot(kernel: &str, iteration: u32, variants: &[&str]) -> BootOrder {
        BootOrder {
            kernel: kernel.into(),
            scenario: "s".into(),
            iteration,
            variants: variants.iter().map(|v| v.to_string()).collect(),
            machine: None,
        }
    }

    #[test]
    fn a_planned_variant_run_without_a_record_is_counted_as_not_run() {
        // Planned: A and B, two iterations of variants v and w. Recorded:
        // A both iterations of v, B the first of v; no w at all.
        let order = [
            boot("A", 0, &["v", "w"]),
            boot("B", 0, &["v", "w"]),
            boot("A", 1, &["v", "w"]),
            boot("B", 1, &["v", "w"]),
        ];
        let mut recs = vec![
            rec("A", 10.0, 100.0),
            rec("B", 20.0, 90.0),
            rec("A", 12.0, 110.0),
        ];
        recs[2].iteration = 1;
        let rows = rows_planned(&recs, &order);
        let row = |v: &str, k: &str| {
            rows.iter()
                .find(|r| r.variant == v && r.kernel == k)
                .unwrap_or_else(|| panic!("no row {v} {k}: {rows:?}"))
        };
        let n = |v, k| {
            let r = row(v, k);
            (r.iterations, r.failed, r.not_run)
        };
        assert_eq!(n("v", "A"), (2, 0, 0));
        assert_eq!(n("v", "B"), (1, 0, 1));
        // Rows with no record at all are listed, their metrics empty.
        assert_eq!(n("w", "A"), (0, 0, 2));
        assert_eq!(n("w", "B"), (0, 0, 2));
        assert!(row("w", "A").metrics.is_empty());
        assert_eq!(rows.len(), 4);
        assert_eq!(
            not_run(&order, &recs),
            ["A s/w #0", "B s/w #0", "A s/w #1", "B s/v #1", "B s/w #1"]
        );
        let t = table_planned(&recs, &order);
        assert!(line_of(&t, "v", "B").contains(" 1 (1 not run) "), "{t}");
        assert!(line_of(&t, "w", "A").contains(" 0 (2 not run) "), "{t}");
        assert!(
            t.contains("not run: 5 of 8 planned variant runs left no record: A s/w #0, "),
            "{t}"
        );
        // A failed record is counted apart from a missing one.
        recs[1].ok = false;
        let t = table_planned(&recs, &order);
        assert!(
            line_of(&t, "v", "B").contains(" 1 (1 failed, 1 not run) "),
            "{t}"
        );
        // Every planned run recorded: nothing not run.
        let all = [boot("A", 0, &["v"]), boot("B", 0, &["v"])];
        assert!(not_run(&all, &recs[..2]).is_empty());
        assert!(rows_planned(&recs[..2], &all)
            .iter()
            .all(|r| r.not_run == 0));
        assert!(!table_planned(&recs[..2], &all).contains("not run"));
        // A run.json older than the boots' variants plans nothing to tell.
        assert!(not_run(&[boot("A", 0, &[])], &[]).is_empty());
    }

    fn line_of(t: &str, v: &str, k: &str) -> String {
        t.lines()
            .find(|l| l.starts_with(&format!("s/{v} ")) && l.contains(&format!(" {k} ")))
            .unwrap_or_else(|| panic!("no line {v} {k}:\n{t}"))
            .to_string()
    }
}
