//! The page's last section, every number: per row, each metric with data
//! (shown above or not) with both sides' summaries and the test; for the
//! difference in differences, each kernel's pair effect and the DiD.

use std::collections::BTreeMap;

use maud::{html, Markup};

use super::metrics::{effect_cells, finding, floor_cells, floor_cols};
use super::table::{anchor, Cell, Col, Table, Tint};
use super::{sides_caption, with_unit, Page};
use crate::record::metrics;
use crate::report::compare::{DidCell, Mode, Report, Row};
use crate::report::inference::{Comparison, DiffInDiff, Summary};
use crate::report::render;

/// The columns of a summary: n, mean, sd, cv, skewness, min, max.
fn summary_cols(side: &str, tint: Tint, unit: &str) -> Vec<Col> {
    vec![
        Col::num(format!("{side} n")).tint(tint),
        Col::num(with_unit(&format!("{side} mean"), unit)).tint(tint),
        Col::num(format!("{side} sd")).tint(tint),
        Col::num(format!("{side} cv (%)")).tint(tint),
        Col::num(format!("{side} skewness")).tint(tint),
        Col::num(format!("{side} min")).tint(tint),
        Col::num(format!("{side} max")).tint(tint),
    ]
}

fn summary_cells(s: &Summary) -> Vec<Cell> {
    vec![
        Cell::count(s.n),
        Cell::num(s.mean),
        Cell::num(s.sd),
        Cell::pct_plain(s.cv_pct),
        Cell::Num(s.skewness, format!("{:.2}", s.skewness)),
        Cell::num(s.min),
        Cell::num(s.max),
    ]
}

fn yes_no(v: bool) -> Cell {
    Cell::text(if v { "yes" } else { "no" })
}

/// A comparison's test: delta, interval, method, p, significant, noisy.
fn test_cells(c: &Comparison) -> Vec<Cell> {
    let mut v: Vec<Cell> = effect_cells(c.delta_pct, c.ci_pct).into();
    v.extend([
        Cell::text(render::method(c.outcome.method)),
        Cell::p(c.outcome.p_value),
        yes_no(c.outcome.significant),
        yes_no(c.outcome.noisy),
    ]);
    v
}

fn test_cols() -> Vec<Col> {
    vec![
        Col::num("delta (%)"),
        Col::num("CI low (%)"),
        Col::num("CI high (%)"),
        Col::text("method"),
        Col::num("p"),
        Col::text("significant"),
        Col::text("noisy"),
    ]
}

/// Every number of the report's rows: each metric with data, shown or
/// not, with both sides' summaries and the test.
pub(super) fn section(page: &mut Page, report: &Report) -> std::io::Result<Markup> {
    page.section("numbers", "Every number", |page| {
        let mut subs = Vec::new();
        for r in &report.rows {
            let body = if report.mode == Mode::Did {
                did_numbers(report, r)
            } else {
                html! { (row_numbers(report, r)) }
            };
            subs.push(page.sub(&anchor(&format!("numbers-{}", r.name())), &r.name(), body));
        }
        Ok(html! {
            p.legend {
                "Every metric each row has data for, whether shown above or not (report.json \
                 holds the same). p-values are before Holm's correction; \"significant\" is \
                 after it, for the metrics shown."
            }
            @for s in subs { (s) }
        })
    })
}

/// A row's numbers: each metric's two summaries and its test.
fn row_numbers(report: &Report, r: &Row) -> Table {
    let mut cols = vec![Col::text("metric"), Col::text("unit")];
    cols.extend(summary_cols("A", Tint::A, ""));
    cols.extend(summary_cols("B", Tint::B, ""));
    cols.extend(test_cols());
    let floors = report.has_floors();
    if floors {
        cols.extend(floor_cols());
        cols.push(Col::text("within the A/A floor"));
    }
    let mut t =
        Table::new(&format!("numbers-table-{}", r.name()), cols).caption(sides_caption(report));
    for m in metrics::METRICS {
        let Some(c) = r.metrics.get(m.key) else {
            continue;
        };
        let mut cells = vec![Cell::text(m.title), Cell::text(m.unit)];
        cells.extend(summary_cells(&c.a));
        cells.extend(summary_cells(&c.b));
        cells.extend(test_cells(c));
        if floors {
            let floor = r.aa_floor.get(m.key);
            cells.extend(floor_cells(floor));
            cells.push(floor.map_or(Cell::text("-"), |f| yes_no(f.within)));
        }
        t.row_class(cells, finding(report, r, m.key, c).then_some("sig"));
    }
    t
}

/// A difference-in-differences row's numbers: each kernel's pair effect
/// (both groups' summaries and the test), then the DiD.
fn did_numbers(report: &Report, r: &Row) -> Markup {
    let mut cols = vec![Col::text("metric"), Col::text("effect")];
    cols.extend(summary_cols("base", Tint::None, ""));
    cols.extend(summary_cols("other", Tint::None, ""));
    cols.extend(test_cols());
    let mut t = Table::new(&format!("numbers-effects-{}", r.name()), cols);
    let mut d = Table::new(
        &format!("numbers-did-{}", r.name()),
        vec![
            Col::text("metric"),
            Col::num(format!("n A {} base", report.a.kernel)).tint(Tint::A),
            Col::num(format!("n A {} other", report.a.kernel)).tint(Tint::A2),
            Col::num(format!("n B {} base", report.b.kernel)).tint(Tint::B),
            Col::num(format!("n B {} other", report.b.kernel)).tint(Tint::B2),
            Col::num("ln ratio of ratios"),
            Col::num("se"),
            Col::num("df"),
            Col::num("DiD (%)"),
            Col::num("CI low (%)"),
            Col::num("CI high (%)"),
            Col::text("method"),
            Col::num("p"),
            Col::text("significant"),
            Col::text("noisy"),
        ],
    );
    let cells: BTreeMap<&str, &DidCell> = r.did.iter().map(|(k, v)| (k.as_str(), v)).collect();
    for m in metrics::METRICS {
        let Some(c) = cells.get(m.key) else { continue };
        for (effect, e) in [(&report.a.kernel, &c.a), (&report.b.kernel, &c.b)] {
            let mut row = vec![Cell::text(m.title), Cell::text(format!("pair on {effect}"))];
            row.extend(summary_cells(&e.a));
            row.extend(summary_cells(&e.b));
            row.extend(test_cells(e));
            t.row_class(row, e.outcome.significant.then_some("sig"));
        }
        d.row_class(
            did_cells(m.title, &c.did),
            c.did.outcome.significant.then_some("sig"),
        );
    }
    html! { (t) (d) }
}

fn did_cells(title: &str, x: &DiffInDiff) -> Vec<Cell> {
    let mut v = vec![Cell::text(title)];
    v.extend(x.n.iter().map(|&n| Cell::count(n)));
    v.extend([
        Cell::Num(x.log_ratio, format!("{:.4}", x.log_ratio)),
        Cell::opt(x.se, |s| Cell::Num(s, format!("{s:.4}"))),
        Cell::opt(x.df, |s| Cell::Num(s, format!("{s:.1}"))),
    ]);
    v.extend(effect_cells(x.delta_pct, x.ci_pct));
    v.extend([
        Cell::text(render::method(x.outcome.method)),
        Cell::p(x.outcome.p_value),
        yes_no(x.outcome.significant),
        yes_no(x.outcome.noisy),
    ]);
    v
}
