//! The table `blklab run` prints: per scenario variant and kernel, the mean
//! and spread of the headline metrics over iterations.

use std::collections::BTreeMap;

use crate::record::result::ResultRecord;
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

/// Rows in first-seen order of (scenario, variant), kernels in run order.
pub fn rows(records: &[ResultRecord]) -> Vec<Row> {
    let mut order: Vec<(String, String, String)> = Vec::new();
    let mut groups: BTreeMap<(String, String, String), Vec<&ResultRecord>> = BTreeMap::new();
    for r in records {
        let key = (r.scenario.clone(), r.variant.clone(), r.kernel.clone());
        if !groups.contains_key(&key) {
            order.push(key.clone());
        }
        groups.entry(key).or_default().push(r);
    }
    // Group rows of the same scenario/variant together.
    let mut sorted: Vec<(String, String, String)> = Vec::new();
    for k in &order {
        if sorted.contains(k) {
            continue;
        }
        for k2 in order.iter().filter(|k2| k2.0 == k.0 && k2.1 == k.1) {
            sorted.push(k2.clone());
        }
    }
    sorted
        .into_iter()
        .map(|k| {
            let recs = &groups[&k];
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
                scenario: k.0.clone(),
                variant: k.1.clone(),
                kernel: k.2.clone(),
                iterations: recs.len(),
                failed: recs.len() - ok.len(),
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

/// The plain-text table (mean±sd over iterations).
pub fn table(records: &[ResultRecord]) -> String {
    let rows = rows(records);
    let mut header = vec!["scenario/variant".to_string(), "kernel".into(), "n".into()];
    header.extend(METRICS.iter().map(|(_, h)| h.to_string()));
    let mut cells: Vec<Vec<String>> = vec![header];
    for r in &rows {
        let mut line = vec![
            format!("{}/{}", r.scenario, r.variant),
            r.kernel.clone(),
            if r.failed > 0 {
                format!("{} ({} failed)", r.iterations, r.failed)
            } else {
                r.iterations.to_string()
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::{test_cpu_all, test_record};
    use serde_json::json;

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
    }
}
