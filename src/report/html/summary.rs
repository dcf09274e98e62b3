//! The page's sections about the comparison as a whole: the verdict, the
//! run (each side's identity, the statistics, warnings, failed runs), what
//! differs between the sides, and `--coverage`'s exits.

use maud::{html, Markup};

use super::table::{Cell, Col, Table, Tint};
use super::{row_id, sides_caption, Page};
use crate::record::metrics;
use crate::report::compare::Report;
use crate::report::verdict::{Call, RowVerdict};

/// The verdict: each row in words, then every significant change.
pub(super) fn verdict(
    page: &mut Page,
    report: &Report,
    verdicts: &[RowVerdict],
) -> std::io::Result<Markup> {
    let mut legend = format!(
        "* significant: the change survives Holm's correction over every row and metric \
         shown, at {:.0} % confidence; ~ noise: no metric shown changes beyond its run-to-run \
         noise; n<3: too few runs to call. \"In every run\": the runs of the two sides do \
         not overlap.",
        report.confidence * 100.0
    );
    if let Some(l) = crate::report::render::floor_legend(report) {
        legend.push_str(&format!(" {l}."));
    }
    page.section("verdict", "Verdict", |_| {
        Ok(html! {
            p.legend { (legend) }
            @for (v, r) in verdicts.iter().zip(&report.rows) {
                div.verdict-row {
                    a href={ "#" (row_id(r)) } { strong { (v.row) } }
                    " "
                    span class={ "call " (call_class(v.call)) } { (v.call.text()) }
                    br; (v.words) br; small { (r.about) }
                }
            }
            (changes_table(report, verdicts))
        })
    })
}

/// The class of a call's badge.
fn call_class(call: Call) -> &'static str {
    match call {
        Call::Significant => "significant",
        Call::Noise => "noise",
        Call::TooFew => "too_few",
        Call::Aa => "aa",
        Call::WithinAaFloor => "within_aa_floor",
    }
}

/// Every significant change, one line each; a row without any: one line
/// with its call.
fn changes_table(report: &Report, verdicts: &[RowVerdict]) -> Table {
    let mut t = Table::new(
        "verdict-changes",
        vec![
            Col::text("row"),
            Col::text("call"),
            Col::text("metric"),
            Col::text("effect"),
            Col::num("A mean").tint(Tint::A),
            Col::num("B mean").tint(Tint::B),
            Col::num("delta (%)"),
            Col::num("CI low (%)"),
            Col::num("CI high (%)"),
            Col::text("for B"),
        ],
    )
    .caption(format!(
        "Significant changes, one line each (a row without any: one line with its call); {}",
        sides_caption(report)
    ));
    for v in verdicts {
        if v.changes.is_empty() {
            let mut cells = vec![Cell::text(&v.row), Cell::text(v.call.text())];
            cells.extend((0..8).map(|_| Cell::text("-")));
            t.row(cells);
        }
        for c in &v.changes {
            t.row_class(
                vec![
                    Cell::text(&v.row),
                    Cell::text(v.call.text()),
                    Cell::text(metrics::find(&c.metric).map_or(c.metric.as_str(), |m| m.title)),
                    Cell::text(&c.effect),
                    Cell::opt(c.a_mean, Cell::num),
                    Cell::opt(c.b_mean, Cell::num),
                    Cell::pct(c.delta_pct),
                    Cell::opt(c.ci_lo_pct, Cell::pct),
                    Cell::opt(c.ci_hi_pct, Cell::pct),
                    Cell::text(if c.worse { "worse" } else { "better" }),
                ],
                Some("sig"),
            );
        }
    }
    t
}

fn yes(v: bool) -> String {
    if v { "yes" } else { "no" }.to_string()
}

/// The run: each side's identity, the statistics, the warnings and the
/// failed runs.
pub(super) fn run(page: &mut Page, report: &Report) -> std::io::Result<Markup> {
    page.section("run", "The run", |_| {
        Ok(html! {
            (identity_table(report))
            (statistics_table(report))
            (warnings(report))
            (failed(report))
        })
    })
}

/// Each side's run: kernel, directory, accelerator, QEMU, blklab, host….
fn identity_table(report: &Report) -> Table {
    let (a, b) = (&report.a, &report.b);
    let mut t = Table::facts(
        "run-identity",
        vec![
            Col::text(""),
            Col::text(format!("A {}", a.kernel)).tint(Tint::A).wrap(),
            Col::text(format!("B {}", b.kernel)).tint(Tint::B).wrap(),
        ],
    );
    let texts = |x: String, y: String| vec![Cell::text(x), Cell::text(y)];
    let counts = |x: usize, y: usize| vec![Cell::count(x), Cell::count(y)];
    let (ra, rb) = (&a.run, &b.run);
    let rows: [(&str, Vec<Cell>); 13] = [
        (
            "kernel",
            texts(a.kernel_spec.clone(), b.kernel_spec.clone()),
        ),
        (
            "run directory",
            texts(a.dir.display().to_string(), b.dir.display().to_string()),
        ),
        ("records", counts(a.records, b.records)),
        ("started", texts(ra.started.clone(), rb.started.clone())),
        ("accelerator", texts(ra.accel.clone(), rb.accel.clone())),
        (
            "why this accelerator",
            texts(ra.accel_reason.clone(), rb.accel_reason.clone()),
        ),
        (
            "deterministic (-icount)",
            texts(yes(ra.deterministic), yes(rb.deterministic)),
        ),
        (
            "guest instructions counted",
            texts(yes(ra.instructions), yes(rb.instructions)),
        ),
        ("QEMU", texts(ra.qemu.clone(), rb.qemu.clone())),
        ("vCPUs", texts(ra.vcpus.clone(), rb.vcpus.clone())),
        (
            "iterations",
            counts(ra.iterations as usize, rb.iterations as usize),
        ),
        (
            "blklab (commit)",
            texts(ra.blklab.clone(), rb.blklab.clone()),
        ),
        ("host", texts(ra.host.clone(), rb.host.clone())),
    ];
    for (what, cells) in rows {
        let mut row = vec![Cell::text(what)];
        row.extend(cells);
        t.row(row);
    }
    t
}

/// The comparison's settings: confidence, metrics, rows, `--force`.
fn statistics_table(report: &Report) -> Table {
    let mut s = Table::facts("run-statistics", vec![Col::text(""), Col::num("value")]);
    s.row(vec![
        Cell::text("confidence of the intervals"),
        Cell::Num(
            report.confidence,
            format!("{:.0} %", report.confidence * 100.0),
        ),
    ]);
    s.row(vec![
        Cell::text("metrics shown"),
        Cell::count(report.metrics.len()),
    ]);
    s.row(vec![Cell::text("rows"), Cell::count(report.rows.len())]);
    s.row(vec![
        Cell::text("compared even though the setups differ (--force)"),
        Cell::text(yes(report.forced)),
    ]);
    if let Some(p) = &report.aa_pair {
        let what = if p.this_comparison {
            "A and B themselves: every delta is the floor"
        } else {
            "beside each delta"
        };
        s.row(vec![
            Cell::text("the run's A/A floor (one kernel under two labels)"),
            Cell::text(format!(
                "{} against {} ({}): {what}",
                p.second, p.first, p.same_kernel
            )),
        ]);
    }
    s
}

/// Every profile's measurement-artefact warnings, in one table.
fn warnings(report: &Report) -> Markup {
    let mut t = Table::new(
        "warnings",
        vec![
            Col::text("row"),
            Col::text("side"),
            Col::text("function"),
            Col::text("kind"),
            Col::num("rank"),
            Col::num("instructions per IO"),
            Col::num("share of the kernel's (%)"),
            Col::text("what it suggests").wrap(),
        ],
    )
    .caption("Warnings: measurement artefacts near the top of a profile");
    for p in &report.profiles {
        for w in &p.warnings {
            let side = if w.side == "a" {
                format!("A {}", p.a_label)
            } else {
                format!("B {}", p.b_label)
            };
            t.row(vec![
                Cell::text(p.title()),
                Cell::text(side),
                Cell::text(&w.function),
                Cell::text(w.kind),
                Cell::count(w.rank),
                Cell::num(w.per_io),
                Cell::pct_plain(w.kernel_share_pct),
                Cell::text(w.hint),
            ]);
        }
    }
    html! {
        @if t.is_empty() {
            p { "No measurement artefact near the top of any profile." }
        } @else {
            div.warning { (t) }
        }
    }
}

/// Runs left out because they failed, per row.
fn failed(report: &Report) -> Table {
    let mut t = Table::new(
        "failed",
        vec![
            Col::text("row"),
            Col::num("A failed runs").tint(Tint::A),
            Col::num("B failed runs").tint(Tint::B),
        ],
    )
    .caption("Runs left out because they failed");
    for r in &report.rows {
        t.row(vec![
            Cell::text(r.name()),
            Cell::count(r.failed_a),
            Cell::count(r.failed_b),
        ]);
    }
    t
}

/// What differs between the sides besides the kernel, and how each pair's
/// variants differ by design.
pub(super) fn differences(page: &mut Page, report: &Report) -> std::io::Result<Markup> {
    let mut t = Table::new(
        "differences",
        vec![
            Col::text("what"),
            Col::text("A").tint(Tint::A).wrap(),
            Col::text("B").tint(Tint::B).wrap(),
            Col::text("kind"),
        ],
    );
    for d in &report.differences {
        let kind = if d.by_design {
            "the pair's variants differ by design"
        } else if d.blocking {
            "would refuse the comparison (forced)"
        } else {
            "differs"
        };
        let mut what = d.what.clone();
        if !d.rows.is_empty() {
            what.push_str(&format!(" in {}", d.rows.join(", ")));
        }
        if let Some(side) = &d.within {
            what.push_str(&format!(", within side {side}"));
        }
        t.row(vec![
            Cell::text(&what),
            Cell::text(&d.a),
            Cell::text(&d.b),
            Cell::text(kind),
        ]);
    }
    page.section("differences", "What differs besides the kernel", |_| {
        Ok(html! {
            @if t.is_empty() {
                p {
                    "Nothing: every condition of the comparability contract (accelerator, \
                     --deterministic, instruction counting, vCPUs, memory, kernel command \
                     line, QEMU, scenario, backend, guest image, blklab version) and the host \
                     are the same."
                }
            } @else {
                (t)
            }
        })
    })
}

/// `--coverage`: the would-be exits beside a nested run's KVM exits
/// (nothing without it).
pub(super) fn coverage(page: &mut Page, report: &Report) -> std::io::Result<Markup> {
    let Some(c) = &report.coverage else {
        return Ok(html! {});
    };
    let lines = crate::report::coverage::lines(c);
    page.section("coverage", "Would-be exits against KVM's exits", |_| {
        Ok(html! { ul { @for l in &lines { li { (l.trim_start()) } } } })
    })
}
