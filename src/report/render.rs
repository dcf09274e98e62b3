//! A comparison as a terminal table, Markdown, CSV or JSON.

use crate::record::metrics;
use crate::report::compare::{Report, Row};
use crate::report::inference::{Comparison, Method};

use crate::util::text::{aligned_lines, num};

fn pct(v: f64) -> String {
    if v.is_finite() {
        format!("{v:+.1}%")
    } else {
        "-".into()
    }
}

/// The significance mark: `*` significant, `~` noise exceeds the delta,
/// `n<3` too few samples to say.
pub(crate) fn mark(c: &Comparison) -> &'static str {
    if c.a.n < crate::report::inference::MIN_SAMPLES_FOR_SIGNIFICANCE
        || c.b.n < crate::report::inference::MIN_SAMPLES_FOR_SIGNIFICANCE
    {
        "n<3"
    } else if c.significant {
        "*"
    } else if c.noisy {
        "~"
    } else {
        ""
    }
}

fn ci(c: &Comparison) -> String {
    match c.ci_pct {
        Some(i) => format!("[{:+.1}%, {:+.1}%]", i.lo, i.hi),
        None => "-".into(),
    }
}

fn method(c: &Comparison) -> &'static str {
    match c.method {
        Method::Welch => "welch",
        Method::Bootstrap => "bootstrap",
        Method::Conservative => "welch+bootstrap",
        Method::None => "none",
    }
}

fn row_name(r: &Row) -> String {
    format!("{}/{}", r.scenario, r.variant)
}

/// Cells of one metric section: header + one line per row.
fn section(report: &Report, key: &str) -> (String, Vec<Vec<String>>) {
    let m = metrics::find(key).expect("metrics are checked when the report is built");
    let unit = if m.unit.is_empty() {
        String::new()
    } else {
        format!(" ({})", m.unit)
    };
    let better = match m.better {
        metrics::Better::Lower => "lower is better",
        metrics::Better::Higher => "higher is better",
    };
    let title = format!("{}{unit}, {better}", m.title);
    let mut cells = vec![vec![
        "scenario/variant".to_string(),
        "iotype".into(),
        "qd".into(),
        "nj".into(),
        "rmix".into(),
        format!("A {}", report.a.kernel),
        "cv".into(),
        format!("B {}", report.b.kernel),
        "cv".into(),
        "delta".into(),
        format!("{:.0}% CI", report.confidence * 100.0),
        "".into(),
    ]];
    for r in &report.rows {
        let Some(c) = r.metrics.get(key) else {
            continue;
        };
        cells.push(vec![
            row_name(r),
            r.labels.iotype.clone(),
            r.labels.qd.clone(),
            r.labels.nj.clone(),
            r.labels.rmix.clone(),
            format!("{} (n={})", num(c.a.mean), c.a.n),
            format!("{:.1}%", c.a.cv_pct),
            format!("{} (n={})", num(c.b.mean), c.b.n),
            format!("{:.1}%", c.b.cv_pct),
            pct(c.delta_pct),
            ci(c),
            mark(c).to_string(),
        ]);
    }
    (title, cells)
}

fn legend(report: &Report) -> String {
    format!(
        "A = {} ({}), B = {} ({}); delta = (B - A) / A; {:.0}% CI of the delta \
         (Welch's t with >= 5 samples a side and no skew, bootstrap when skewed, the wider of \
         both with fewer samples); * significant after Holm's correction over every row and \
         metric shown, ~ noise (cv) exceeds the delta, n<3 too few samples to call",
        report.a.kernel,
        report.a.dir.display(),
        report.b.kernel,
        report.b.dir.display(),
        report.confidence * 100.0
    )
}

fn differences_text(report: &Report) -> Vec<String> {
    report
        .differences
        .iter()
        .map(|d| {
            format!(
                "{}{}: A {} | B {}",
                d.what,
                if d.blocking { " (forced)" } else { "" },
                d.a,
                d.b
            )
        })
        .collect()
}

/// The terminal table: one section per metric.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    for key in &report.metrics {
        let (title, cells) = section(report, key);
        if cells.len() == 1 {
            continue;
        }
        out.push_str(&title);
        out.push('\n');
        let (lines, _) = aligned_lines(&cells, |l, i| i <= 1 || i == l.len() - 1);
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
        out.push('\n');
    }
    out.push_str(&legend(report));
    out.push('\n');
    out.push_str(&profile_block(report, false));
    let d = differences_text(report);
    if !d.is_empty() {
        out.push_str("besides the kernel, the sides differ in:\n");
        for l in d {
            out.push_str(&format!("  {l}\n"));
        }
    }
    let failed: Vec<String> = report
        .rows
        .iter()
        .filter(|r| r.failed_a + r.failed_b > 0)
        .map(|r| format!("{} ({} A, {} B)", row_name(r), r.failed_a, r.failed_b))
        .collect();
    if !failed.is_empty() {
        out.push_str(&format!("failed runs left out: {}\n", failed.join(", ")));
    }
    out
}

/// The differential instruction profile after a blank line, when the
/// report has one.
fn profile_block(report: &Report, markdown: bool) -> String {
    if report.profiles.is_empty() {
        return String::new();
    }
    format!(
        "\n{}",
        crate::report::profile::render(
            &report.profiles,
            &report.a.kernel,
            &report.b.kernel,
            markdown,
        )
    )
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Markdown, to paste into a mailing-list reply.
pub fn markdown(report: &Report) -> String {
    let mut out = format!(
        "### blklab: {} (A) vs {} (B)\n\n",
        md_escape(&report.a.kernel),
        md_escape(&report.b.kernel)
    );
    for key in &report.metrics {
        let (title, cells) = section(report, key);
        if cells.len() == 1 {
            continue;
        }
        out.push_str(&format!("**{}**\n\n", md_escape(&title)));
        for (i, l) in cells.iter().enumerate() {
            let line: Vec<String> = l.iter().map(|c| md_escape(c)).collect();
            out.push_str(&format!("| {} |\n", line.join(" | ")));
            if i == 0 {
                let align: Vec<&str> = (0..l.len())
                    .map(|j| {
                        if j <= 1 || j == l.len() - 1 {
                            "---"
                        } else {
                            "---:"
                        }
                    })
                    .collect();
                out.push_str(&format!("|{}|\n", align.join("|")));
            }
        }
        out.push('\n');
    }
    out.push_str(&md_escape(&legend(report)));
    out.push('\n');
    out.push_str(&profile_block(report, true));
    let d = differences_text(report);
    if !d.is_empty() {
        out.push_str("\nBesides the kernel, the sides differ in:\n\n");
        for l in d {
            out.push_str(&format!("- {}\n", md_escape(&l)));
        }
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// CSV: one line per (row, metric), every metric with data.
pub fn csv(report: &Report) -> String {
    let mut out = String::from(
        "scenario,variant,iotype,qd,nj,rmix,metric,unit,a_kernel,a_n,a_mean,a_sd,a_cv_pct,\
         b_kernel,b_n,b_mean,b_sd,b_cv_pct,delta_pct,ci_lo_pct,ci_hi_pct,method,p_value,significant,noisy\n",
    );
    for r in &report.rows {
        for m in metrics::METRICS {
            let Some(c) = r.metrics.get(m.key) else {
                continue;
            };
            let f = |v: f64| {
                if v.is_finite() {
                    format!("{v}")
                } else {
                    String::new()
                }
            };
            let fields = [
                r.scenario.clone(),
                r.variant.clone(),
                r.labels.iotype.clone(),
                r.labels.qd.clone(),
                r.labels.nj.clone(),
                r.labels.rmix.clone(),
                m.key.to_string(),
                m.unit.to_string(),
                report.a.kernel.clone(),
                c.a.n.to_string(),
                f(c.a.mean),
                f(c.a.sd),
                f(c.a.cv_pct),
                report.b.kernel.clone(),
                c.b.n.to_string(),
                f(c.b.mean),
                f(c.b.sd),
                f(c.b.cv_pct),
                f(c.delta_pct),
                c.ci_pct.map(|i| f(i.lo)).unwrap_or_default(),
                c.ci_pct.map(|i| f(i.hi)).unwrap_or_default(),
                method(c).to_string(),
                c.p_value.map(f).unwrap_or_default(),
                c.significant.to_string(),
                c.noisy.to_string(),
            ];
            let line: Vec<String> = fields.iter().map(|s| csv_field(s)).collect();
            out.push_str(&line.join(","));
            out.push('\n');
        }
    }
    out
}

/// The whole report as JSON.
pub fn json(report: &Report) -> String {
    serde_json::to_string_pretty(report).expect("reports serialize") + "\n"
}
