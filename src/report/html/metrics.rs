//! The page's metrics section: per metric, a sortable table of the rows
//! beside the bars of each group's mean.

use maud::{html, Markup};

use super::table::{anchor, Cell, Col, Table, Tint};
use super::{beside, file_safe, groups_style, plots, sides_caption, unit_of, with_unit, Page};
use crate::record::metrics;
use crate::report::compare::{Mode, Report};
use crate::report::inference::Interval;
use crate::report::render;

/// The legend of a metric's groups: kernels, or with pairs what A and B
/// are.
fn series_labels(report: &Report) -> Vec<String> {
    match report.mode {
        Mode::Kernels => vec![
            format!("A {}", report.a.kernel),
            format!("B {}", report.b.kernel),
        ],
        Mode::Variants => vec![
            format!("A base on {}", report.a.kernel),
            format!("B other on {}", report.a.kernel),
        ],
        Mode::Did => vec![
            format!("A {} base", report.a.kernel),
            format!("A {} other", report.a.kernel),
            format!("B {} base", report.b.kernel),
            format!("B {} other", report.b.kernel),
        ],
    }
}

/// The significance mark of a comparison, with the word.
fn mark_cell(m: &str) -> Cell {
    let word = match m {
        "*" => "* significant",
        "~" => "~ noise",
        "n<3" => "n<3 too few",
        _ => "",
    };
    Cell::text(word)
}

/// delta, CI low, CI high.
pub(super) fn effect_cells(delta: f64, ci: Option<Interval>) -> [Cell; 3] {
    [
        Cell::pct(delta),
        Cell::opt(ci.map(|i| i.lo), Cell::pct),
        Cell::opt(ci.map(|i| i.hi), Cell::pct),
    ]
}

/// A metric table's columns: the row, its labels, then each kernel's pair
/// effect and the DiD, or each side's mean, n and cv and the test.
fn metric_cols(report: &Report, unit: &str) -> Vec<Col> {
    let labels = ["iotype", "qd", "nj", "rmix"].map(Col::text);
    let first = match report.mode {
        Mode::Kernels => "scenario/variant",
        _ => "scenario/base → other",
    };
    let mut cols = vec![Col::text(first)];
    cols.extend(labels);
    if report.mode == Mode::Did {
        for (k, tint) in [(&report.a.kernel, Tint::A), (&report.b.kernel, Tint::B)] {
            cols.extend([
                Col::num(format!("{k}: other vs base (%)")).tint(tint),
                Col::num("CI low (%)").tint(tint),
                Col::num("CI high (%)").tint(tint),
                Col::text("mark").tint(tint),
            ]);
        }
        cols.extend([
            Col::num("DiD (%)"),
            Col::num("CI low (%)"),
            Col::num("CI high (%)"),
            Col::text("mark"),
        ]);
    } else {
        for (h, tint) in [("A", Tint::A), ("B", Tint::B)] {
            cols.extend([
                Col::num(with_unit(&format!("{h} mean"), unit)).tint(tint),
                Col::num(format!("{h} n")).tint(tint),
                Col::num(format!("{h} cv (%)")).tint(tint),
            ]);
        }
        cols.extend([
            Col::num("delta (%)"),
            Col::num("CI low (%)"),
            Col::num("CI high (%)"),
            Col::num("p"),
            Col::text("mark"),
        ]);
    }
    cols
}

/// A metric's table: one line per row.
fn metric_table(report: &Report, key: &str) -> Table {
    let cols = metric_cols(report, unit_of(key));
    let mut t = Table::new(&format!("metric-table-{key}"), cols).caption(sides_caption(report));
    for r in &report.rows {
        let mut cells = vec![Cell::text(r.name())];
        cells.extend(render::label_cells(r).into_iter().map(Cell::text));
        if report.mode == Mode::Did {
            let Some(c) = r.did.get(key) else { continue };
            let sig =
                c.a.outcome.significant || c.b.outcome.significant || c.did.outcome.significant;
            for e in [&c.a, &c.b] {
                cells.extend(effect_cells(e.delta_pct, e.ci_pct));
                cells.push(mark_cell(render::mark(e)));
            }
            cells.extend(effect_cells(c.did.delta_pct, c.did.ci_pct));
            cells.push(mark_cell(render::did_mark(&c.did)));
            t.row_class(cells, sig.then_some("sig"));
        } else {
            let Some(c) = r.metrics.get(key) else {
                continue;
            };
            for s in [&c.a, &c.b] {
                cells.extend([
                    Cell::num(s.mean),
                    Cell::count(s.n),
                    Cell::pct_plain(s.cv_pct),
                ]);
            }
            cells.extend(effect_cells(c.delta_pct, c.ci_pct));
            cells.push(Cell::p(c.outcome.p_value));
            cells.push(mark_cell(render::mark(c)));
            t.row_class(cells, c.outcome.significant.then_some("sig"));
        }
    }
    t
}

/// A metric's bars (each group's mean per row, rows with data in every
/// group), as a figure; `None` when no row has.
fn metric_figure(page: &mut Page, report: &Report, key: &str) -> std::io::Result<Option<Markup>> {
    let series: Vec<(String, plotters::style::RGBColor)> = series_labels(report)
        .into_iter()
        .zip(groups_style(report).iter().map(|s| s.0))
        .collect();
    let rows: Vec<plots::BarRow> = report
        .rows
        .iter()
        .filter(|r| r.groups.iter().all(|g| g.samples.contains_key(key)))
        .map(|r| {
            (
                r.name(),
                r.groups.iter().map(|g| g.samples.get(key)).collect(),
            )
        })
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let m = metrics::find(key).expect("checked metric");
    let svg = plots::bars(
        &format!("{}: mean, 95 % CI of the mean", with_unit(m.title, m.unit)),
        &rows,
        &series,
    )?;
    let name = format!("metric-{}.svg", file_safe(key));
    page.figure(&name, &svg, &render::title_of(key)).map(Some)
}

/// Each metric: its table beside its bars.
pub(super) fn section(page: &mut Page, report: &Report) -> std::io::Result<Markup> {
    page.section("metrics", "Metrics", |page| {
        let mut subs = Vec::new();
        for key in &report.metrics {
            let t = metric_table(report, key);
            if t.is_empty() {
                continue;
            }
            let figure = metric_figure(page, report, key)?;
            let id = anchor(&format!("metric-{key}"));
            subs.push(page.sub(&id, &render::title_of(key), beside(&t, figure)));
        }
        Ok(html! {
            @for s in subs { (s) }
            p.legend { (render::legend(report)) }
        })
    })
}
