//! A comparison as a terminal table, Markdown, CSV or JSON.

use crate::record::metrics;
use crate::report::compare::{AaFloor, DidCell, Mode, Report, Row};
use crate::report::inference::{
    Comparison, DiffInDiff, Method, Outcome, MIN_SAMPLES_FOR_SIGNIFICANCE,
};
use crate::report::verdict;

use crate::util::text::{aligned_lines, num, wrap};

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
    outcome_mark([c.a.n, c.b.n], &c.outcome)
}

/// The mark a row's metric shows: [`mark`], but `A/A` in a comparison
/// of the run's A/A pair itself, and [`WITHIN_FLOOR`] for a delta within
/// the run's A/A floor (a row with too few samples keeps `n<3`).
pub(crate) fn row_mark(report: &Report, row: &Row, key: &str, c: &Comparison) -> &'static str {
    let m = mark(c);
    if m == "n<3" {
        m
    } else if report.is_aa() {
        AA_MARK
    } else if report.within_floor(row, key).is_some() {
        WITHIN_FLOOR
    } else {
        m
    }
}

/// The mark of the rows of a comparison of the run's A/A pair itself.
pub(crate) const AA_MARK: &str = "A/A";
/// The mark of a delta within the run's A/A floor.
pub(crate) const WITHIN_FLOOR: &str = "within A/A floor";

/// The mark of a difference in differences (as [`mark`], over its four
/// groups).
pub(crate) fn did_mark(d: &DiffInDiff) -> &'static str {
    outcome_mark(d.n, &d.outcome)
}

/// The mark of an outcome whose groups have `n` samples each.
fn outcome_mark<const N: usize>(n: [usize; N], o: &Outcome) -> &'static str {
    if n.iter().any(|&n| n < MIN_SAMPLES_FOR_SIGNIFICANCE) {
        "n<3"
    } else if o.significant {
        "*"
    } else if o.noisy {
        "~"
    } else {
        ""
    }
}

fn ci_text(i: Option<crate::report::inference::Interval>) -> String {
    match i {
        Some(i) => format!("[{:+.1}%, {:+.1}%]", i.lo, i.hi),
        None => "-".into(),
    }
}

fn ci(c: &Comparison) -> String {
    ci_text(c.ci_pct)
}

pub(crate) fn method(m: Method) -> &'static str {
    match m {
        Method::Welch => "welch",
        Method::Bootstrap => "bootstrap",
        Method::Conservative => "welch+bootstrap",
        Method::None => "none",
    }
}

fn row_name(r: &Row) -> String {
    r.name()
}

/// The label cells of a row: iotype, qd, nj, rmix (`base→other` where a
/// pair's variants differ).
pub(crate) fn label_cells(r: &Row) -> Vec<String> {
    let l = &r.labels;
    let base = [&l.iotype, &l.qd, &l.nj, &l.rmix];
    match &r.labels_other {
        None => base.iter().map(|s| s.to_string()).collect(),
        Some(o) => base
            .iter()
            .zip([&o.iotype, &o.qd, &o.nj, &o.rmix])
            .map(|(b, o)| {
                if *b == o {
                    b.to_string()
                } else {
                    format!("{b}→{o}")
                }
            })
            .collect(),
    }
}

pub(crate) fn title_of(key: &str) -> String {
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
    format!("{}{unit}, {better}", m.title)
}

/// The first column's heading.
fn row_heading(report: &Report) -> String {
    match report.mode {
        Mode::Kernels => "scenario/variant".into(),
        _ => "scenario/base → other".into(),
    }
}

/// Cells of one metric section: header + one line per row.
fn section(report: &Report, key: &str) -> (String, Vec<Vec<String>>) {
    if report.mode == Mode::Did {
        return did_section(report, key);
    }
    let title = title_of(key);
    let (ha, hb) = match report.mode {
        Mode::Variants => ("A base".to_string(), "B other".to_string()),
        _ => (
            format!("A {}", report.a.kernel),
            format!("B {}", report.b.kernel),
        ),
    };
    let conf = format!("{:.0}% CI", report.confidence * 100.0);
    let mut head: Vec<String> = vec![row_heading(report)];
    head.extend(["iotype", "qd", "nj", "rmix"].map(String::from));
    head.extend([
        ha,
        "cv".into(),
        hb,
        "cv".into(),
        "delta".into(),
        conf.clone(),
    ]);
    let floors = report.has_floors();
    if floors {
        head.extend(["A/A floor".to_string(), format!("A/A {conf}")]);
    }
    head.push("".into());
    let mut cells = vec![head];
    for r in &report.rows {
        let Some(c) = r.metrics.get(key) else {
            continue;
        };
        let mut line = vec![row_name(r)];
        line.extend(label_cells(r));
        line.extend([
            format!("{} (n={})", num(c.a.mean), c.a.n),
            format!("{:.1}%", c.a.cv_pct),
            format!("{} (n={})", num(c.b.mean), c.b.n),
            format!("{:.1}%", c.b.cv_pct),
            pct(c.delta_pct),
            ci(c),
        ]);
        if floors {
            line.extend(floor_cells(r.aa_floor.get(key)));
        }
        line.push(row_mark(report, r, key, c).to_string());
        cells.push(line);
    }
    (title, cells)
}

/// A row's A/A floor of a metric and its interval (`-` without one).
fn floor_cells(floor: Option<&AaFloor>) -> [String; 2] {
    match floor {
        Some(f) => [pct(f.diff_pct), ci_text(f.ci_pct)],
        None => ["-".into(), "-".into()],
    }
}

/// A difference-in-differences section: each kernel's pair effect (with
/// its interval and mark) and the difference in differences.
fn did_section(report: &Report, key: &str) -> (String, Vec<Vec<String>>) {
    let title = title_of(key);
    let conf = format!("{:.0}% CI", report.confidence * 100.0);
    let mut cells = vec![vec![
        row_heading(report),
        "iotype".into(),
        "qd".into(),
        "nj".into(),
        "rmix".into(),
        format!("A {}: B/A", report.a.kernel),
        conf.clone(),
        "".into(),
        format!("B {}: B/A", report.b.kernel),
        conf.clone(),
        "".into(),
        "DiD".into(),
        conf,
        "".into(),
    ]];
    for r in &report.rows {
        let Some(c) = r.did.get(key) else {
            continue;
        };
        let mut line = vec![row_name(r)];
        line.extend(label_cells(r));
        line.extend([
            pct(c.a.delta_pct),
            ci(&c.a),
            mark(&c.a).to_string(),
            pct(c.b.delta_pct),
            ci(&c.b),
            mark(&c.b).to_string(),
            pct(c.did.delta_pct),
            ci_text(c.did.ci_pct),
            did_mark(&c.did).to_string(),
        ]);
        cells.push(line);
    }
    (title, cells)
}

/// Which columns of a section are left-aligned: the row's name, its
/// iotype and the mark; in a difference-in-differences section the first
/// two effects' marks too.
fn left_aligned(did: bool) -> impl Fn(&[String], usize) -> bool {
    move |l, i| i <= 1 || i == l.len() - 1 || (did && (i == 7 || i == 10))
}

const MARKS: &str = "* significant after Holm's correction over every row and \
         metric shown, ~ noise (cv) exceeds the delta, n<3 too few samples to call";

pub(crate) fn legend(report: &Report) -> String {
    let mut out = sides_legend(report);
    if let Some(l) = floor_legend(report) {
        out.push_str("; ");
        out.push_str(&l);
    }
    out
}

/// What the A/A floor beside the deltas is, or that the comparison is
/// the run's A/A pair itself (`None` without an A/A pair).
pub(crate) fn floor_legend(report: &Report) -> Option<String> {
    let p = report.aa_pair.as_ref()?;
    if p.this_comparison {
        return Some(format!(
            "{AA_MARK}: A and B are one kernel ({}), so every delta here is run-to-run noise: \
             the run's A/A floor, shown beside the deltas of its other comparisons, not a finding",
            p.same_kernel
        ));
    }
    report.has_floors().then(|| {
        format!(
            "A/A floor = this run's A/A pair, {} against {} (one kernel: {}), (second - first) / \
             first with its CI by the same statistics; \"{WITHIN_FLOOR}\": |delta| is not above \
             |A/A floor|, so the delta is no larger than the noise between two labels of one \
             kernel, and the verdict does not call it an effect",
            p.second, p.first, p.same_kernel
        )
    })
}

/// What A and B are and how the delta and its interval are computed.
fn sides_legend(report: &Report) -> String {
    let conf = report.confidence * 100.0;
    match report.mode {
        Mode::Kernels => format!(
            "A = {} ({}), B = {} ({}); delta = (B - A) / A; {conf:.0}% CI of the delta \
             (Welch's t with >= 5 samples a side and no skew, bootstrap when skewed, the wider of \
             both with fewer samples); {MARKS}",
            report.a.kernel,
            report.a.dir.display(),
            report.b.kernel,
            report.b.dir.display(),
        ),
        Mode::Variants => {
            let mut out = String::new();
            for r in &report.rows {
                if let Some(p) = &r.pair {
                    out.push_str(&format!(
                        "{}: A = {} on {k}, B = {} on {k}\n",
                        r.name(),
                        p.base,
                        p.other,
                        k = report.a.kernel
                    ));
                }
            }
            out.push_str(&format!(
                "(run {}); delta = (B - A) / A; {conf:.0}% CI of the delta \
                 (Welch's t with >= 5 samples a side and no skew, bootstrap when skewed, the wider of \
                 both with fewer samples); {MARKS}",
                report.a.dir.display(),
            ));
            out
        }
        Mode::Did => format!(
            "A = kernel {} ({}), B = kernel {} ({}); each row's pair base → other; \
             \"A: B/A\" is the pair's effect on kernel A, (mean(other) - mean(base)) / mean(base), \
             \"B: B/A\" on kernel B; DiD = B's ratio against A's, \
             (mean(B.other)/mean(B.base)) / (mean(A.other)/mean(A.base)) - 1, its {conf:.0}% CI \
             from log space (delta method, Welch-Satterthwaite df, t) with >= 5 samples per group \
             and no skew, bootstrap when skewed, the wider of both with fewer samples; \
             * significant after Holm's correction over every effect and DiD shown, \
             ~ noise (the largest cv) exceeds the value, n<3 too few samples to call",
            report.a.kernel,
            report.a.dir.display(),
            report.b.kernel,
            report.b.dir.display(),
        ),
    }
}

fn difference_line(d: &crate::report::compare::Difference) -> String {
    let forced = if d.blocking { " (forced)" } else { "" };
    let rows = if d.rows.is_empty() {
        String::new()
    } else {
        format!(" in {}", d.rows.join(", "))
    };
    match &d.within {
        Some(side) => format!(
            "{}{forced}{rows}, within side {side}: {} | {}",
            d.what, d.a, d.b
        ),
        None => format!("{}{forced}{rows}: A {} | B {}", d.what, d.a, d.b),
    }
}

/// The lines that open every format of a forced comparison: which
/// conditions differ (none when nothing blocking differs).
pub(crate) fn forced_banner(report: &Report) -> Vec<String> {
    if report.forced_over.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!(
        "FORCED: these sides are not comparable in {} condition(s); the numbers below mix them:",
        report.forced_over.len()
    )];
    out.extend(report.forced_over.iter().map(|l| format!("  {l}")));
    out
}

/// The lines after the forced banner in every format: the records' vCPUs
/// that could not all run at once, a warning each.
pub(crate) fn parallelism_lines(report: &Report) -> Vec<String> {
    report
        .parallelism_warnings
        .iter()
        .map(|w| format!("warning: {w}"))
        .collect()
}

/// (heading, lines) of the differences: what differs besides the kernel,
/// then how each pair's variants differ by design.
fn differences_text(report: &Report) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let sides: Vec<String> = report
        .differences
        .iter()
        .filter(|d| !d.by_design)
        .map(difference_line)
        .collect();
    if !sides.is_empty() {
        out.push((
            "besides the kernel, the sides differ in:".to_string(),
            sides,
        ));
    }
    let pairs: Vec<String> = report
        .differences
        .iter()
        .filter(|d| d.by_design)
        .map(difference_line)
        .collect();
    if !pairs.is_empty() {
        out.push((
            "the variants of each pair differ by design in (A = base, B = other):".to_string(),
            pairs,
        ));
    }
    out
}

/// The terminal table: one section per metric.
pub(crate) fn table(report: &Report) -> String {
    let mut out = String::new();
    for l in forced_banner(report)
        .into_iter()
        .chain(parallelism_lines(report))
    {
        out.push_str(&l);
        out.push('\n');
    }
    for key in &report.metrics {
        let (title, cells) = section(report, key);
        if cells.len() == 1 {
            continue;
        }
        out.push_str(&title);
        out.push('\n');
        let (lines, _) = aligned_lines(&cells, left_aligned(report.mode == Mode::Did));
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
        out.push('\n');
    }
    out.push_str(&legend(report));
    out.push('\n');
    out.push_str(&profile_block(report, false));
    for (heading, lines) in differences_text(report) {
        out.push_str(&heading);
        out.push('\n');
        for l in lines {
            out.push_str(&format!("  {l}\n"));
        }
    }
    if let Some(c) = &report.coverage {
        for l in crate::report::coverage::lines(c) {
            out.push_str(&l);
            out.push('\n');
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
    out.push_str("\nverdict:\n");
    for v in &verdict::judge(report) {
        out.push_str(&format!("  {} ({})\n", v.row, v.call.text()));
        for l in wrap(&v.words, 96, "    ") {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// The differential instruction profile after a blank line, when the
/// report has one.
fn profile_block(report: &Report, markdown: bool) -> String {
    if report.profiles.is_empty() {
        return String::new();
    }
    let sides = match report.mode {
        Mode::Kernels => format!("A = {}, B = {}", report.a.kernel, report.b.kernel),
        Mode::Variants => format!(
            "on {}: A = each pair's base variant, B = its other variant",
            report.a.kernel
        ),
        Mode::Did => "per kernel: A = each pair's base variant, B = its other variant".to_string(),
    };
    format!(
        "\n{}",
        crate::report::profile::render(&report.profiles, &sides, markdown)
    )
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Markdown, to paste into a mailing-list reply.
pub(crate) fn markdown(report: &Report) -> String {
    let mut out = format!("### {}\n\n", md_escape(&heading(report)));
    let banner = forced_banner(report);
    if let Some((first, rest)) = banner.split_first() {
        out.push_str(&format!("**{}**\n\n", md_escape(first)));
        for l in rest {
            out.push_str(&format!("- {}\n", md_escape(l.trim_start())));
        }
        out.push('\n');
    }
    for w in &report.parallelism_warnings {
        out.push_str(&format!("**Warning**: {}\n\n", md_escape(w)));
    }
    out.push_str("**Verdict**\n\n");
    for v in &verdict::judge(report) {
        out.push_str(&format!(
            "- **{}** ({}): {}\n",
            md_escape(&v.row),
            md_escape(v.call.text()),
            md_escape(&v.words)
        ));
    }
    out.push('\n');
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
                let left = left_aligned(report.mode == Mode::Did);
                let align: Vec<&str> = (0..l.len())
                    .map(|j| if left(l, j) { "---" } else { "---:" })
                    .collect();
                out.push_str(&format!("|{}|\n", align.join("|")));
            }
        }
        out.push('\n');
    }
    out.push_str(&md_escape(&legend(report)));
    out.push('\n');
    out.push_str(&profile_block(report, true));
    for (heading, lines) in differences_text(report) {
        let mut h = heading.clone();
        h[..1].make_ascii_uppercase();
        out.push_str(&format!("\n{}\n\n", md_escape(&h)));
        for l in lines {
            out.push_str(&format!("- {}\n", md_escape(&l)));
        }
    }
    if let Some(c) = &report.coverage {
        let lines = crate::report::coverage::lines(c);
        if let Some((head, rest)) = lines.split_first() {
            out.push_str(&format!("\n{}\n\n", md_escape(head)));
            for l in rest {
                out.push_str(&format!("- {}\n", md_escape(l.trim_start())));
            }
        }
    }
    out
}

/// What a report is, in one line (Markdown and HTML headings).
pub(crate) fn heading(report: &Report) -> String {
    match report.mode {
        Mode::Kernels => format!("blklab: {} (A) vs {} (B)", report.a.kernel, report.b.kernel),
        Mode::Variants => format!(
            "blklab: variant pairs on {}, other (B) vs base (A)",
            report.a.kernel
        ),
        Mode::Did => format!(
            "blklab: variant pairs on {} (A) and {} (B), difference in differences",
            report.a.kernel, report.b.kernel
        ),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn f(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        String::new()
    }
}

fn csv_line(fields: &[String]) -> String {
    let line: Vec<String> = fields.iter().map(|s| csv_field(s)).collect();
    line.join(",") + "\n"
}

/// CSV: one line per (row, metric), every metric with data. Kernels:
/// `scenario,variant,…,a_kernel,…,b_kernel,…`, and last
/// `aa_floor_pct,aa_ci_lo_pct,aa_ci_hi_pct,within_aa_floor` when the run
/// has an A/A pair beside the kernels compared; variant pairs: `kernel,base,other,…`
/// with A the base and B the other variant; the difference in differences:
/// each kernel's four means, both pair effects and the DiD.
/// A forced comparison opens with `#` comment lines naming the conditions
/// that differ, then the parallelism warnings as `#` lines.
pub(crate) fn csv(report: &Report) -> String {
    let mut out: String = forced_banner(report)
        .into_iter()
        .chain(parallelism_lines(report))
        .map(|l| format!("# {}\n", l.trim_start()))
        .collect();
    out.push_str(&match report.mode {
        Mode::Kernels => csv_kernels(report),
        Mode::Variants => csv_variants(report),
        Mode::Did => csv_did(report),
    });
    out
}

fn comparison_fields(c: &Comparison) -> Vec<String> {
    vec![
        f(c.delta_pct),
        c.ci_pct.map(|i| f(i.lo)).unwrap_or_default(),
        c.ci_pct.map(|i| f(i.hi)).unwrap_or_default(),
    ]
    .into_iter()
    .chain(outcome_fields(&c.outcome))
    .collect()
}

/// An outcome's CSV fields: method, p_value, significant, noisy.
fn outcome_fields(o: &Outcome) -> [String; 4] {
    [
        method(o.method).to_string(),
        o.p_value.map(f).unwrap_or_default(),
        o.significant.to_string(),
        o.noisy.to_string(),
    ]
}

fn labels_fields(r: &Row) -> Vec<String> {
    label_cells(r)
}

fn csv_kernels(report: &Report) -> String {
    let floors = report.has_floors();
    let mut out = String::from(
        "scenario,variant,iotype,qd,nj,rmix,metric,unit,a_kernel,a_n,a_mean,a_sd,a_cv_pct,\
         b_kernel,b_n,b_mean,b_sd,b_cv_pct,delta_pct,ci_lo_pct,ci_hi_pct,method,p_value,significant,noisy",
    );
    if floors {
        out.push_str(",aa_floor_pct,aa_ci_lo_pct,aa_ci_hi_pct,within_aa_floor");
    }
    out.push('\n');
    for r in &report.rows {
        for m in metrics::METRICS {
            let Some(c) = r.metrics.get(m.key) else {
                continue;
            };
            let mut fields = vec![r.scenario.clone(), r.variant.clone()];
            fields.extend(labels_fields(r));
            fields.extend([
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
            ]);
            fields.extend(comparison_fields(c));
            if floors {
                fields.extend(floor_fields(r.aa_floor.get(m.key)));
            }
            out.push_str(&csv_line(&fields));
        }
    }
    out
}

/// A row's A/A floor of a metric as CSV fields: the floor, its interval
/// and whether the delta is within it (empty without one).
fn floor_fields(floor: Option<&AaFloor>) -> [String; 4] {
    match floor {
        Some(x) => [
            f(x.diff_pct),
            x.ci_pct.map(|i| f(i.lo)).unwrap_or_default(),
            x.ci_pct.map(|i| f(i.hi)).unwrap_or_default(),
            x.within.to_string(),
        ],
        None => Default::default(),
    }
}

fn csv_variants(report: &Report) -> String {
    let mut out = String::from(
        "kernel,base,other,iotype,qd,nj,rmix,metric,unit,a_n,a_mean,a_sd,a_cv_pct,\
         b_n,b_mean,b_sd,b_cv_pct,delta_pct,ci_lo_pct,ci_hi_pct,method,p_value,significant,noisy\n",
    );
    for r in &report.rows {
        let Some(p) = &r.pair else { continue };
        for m in metrics::METRICS {
            let Some(c) = r.metrics.get(m.key) else {
                continue;
            };
            let mut fields = vec![report.a.kernel.clone(), p.base.clone(), p.other.clone()];
            fields.extend(labels_fields(r));
            fields.extend([
                m.key.to_string(),
                m.unit.to_string(),
                c.a.n.to_string(),
                f(c.a.mean),
                f(c.a.sd),
                f(c.a.cv_pct),
                c.b.n.to_string(),
                f(c.b.mean),
                f(c.b.sd),
                f(c.b.cv_pct),
            ]);
            fields.extend(comparison_fields(c));
            out.push_str(&csv_line(&fields));
        }
    }
    out
}

fn csv_did(report: &Report) -> String {
    let mut out = String::from(
        "base,other,iotype,qd,nj,rmix,metric,unit,a_kernel,a_base_n,a_base_mean,a_other_n,a_other_mean,\
         a_effect_pct,a_ci_lo_pct,a_ci_hi_pct,a_significant,b_kernel,b_base_n,b_base_mean,b_other_n,\
         b_other_mean,b_effect_pct,b_ci_lo_pct,b_ci_hi_pct,b_significant,did_pct,ci_lo_pct,ci_hi_pct,\
         log_ratio,se,df,method,p_value,significant,noisy\n",
    );
    for r in &report.rows {
        let Some(p) = &r.pair else { continue };
        for m in metrics::METRICS {
            let Some(DidCell { a, b, did }) = r.did.get(m.key) else {
                continue;
            };
            let mut fields = vec![p.base.clone(), p.other.clone()];
            fields.extend(labels_fields(r));
            fields.extend([m.key.to_string(), m.unit.to_string()]);
            for (k, c) in [(&report.a.kernel, a), (&report.b.kernel, b)] {
                fields.extend([
                    k.clone(),
                    c.a.n.to_string(),
                    f(c.a.mean),
                    c.b.n.to_string(),
                    f(c.b.mean),
                    f(c.delta_pct),
                    c.ci_pct.map(|i| f(i.lo)).unwrap_or_default(),
                    c.ci_pct.map(|i| f(i.hi)).unwrap_or_default(),
                    c.outcome.significant.to_string(),
                ]);
            }
            fields.extend([
                f(did.delta_pct),
                did.ci_pct.map(|i| f(i.lo)).unwrap_or_default(),
                did.ci_pct.map(|i| f(i.hi)).unwrap_or_default(),
                f(did.log_ratio),
                did.se.map(f).unwrap_or_default(),
                did.df.map(f).unwrap_or_default(),
            ]);
            fields.extend(outcome_fields(&did.outcome));
            out.push_str(&csv_line(&fields));
        }
    }
    out
}

/// A report and, last, its verdict (a view of the rest).
#[derive(serde::Serialize)]
struct WithVerdict<'a> {
    #[serde(flatten)]
    report: &'a Report,
    verdict: Vec<verdict::RowVerdict>,
}

/// The whole report as JSON, its verdict last.
pub(crate) fn json(report: &Report) -> String {
    let doc = WithVerdict {
        report,
        verdict: verdict::judge(report),
    };
    serde_json::to_string_pretty(&doc).expect("reports serialize") + "\n"
}
