//! The page's metrics section: per metric, a sortable table of the rows
//! beside the bars of each group's mean.

use maud::{html, Markup};

use super::table::{anchor, Cell, Col, Table, Tint};
use super::{beside, file_safe, groups_style, plots, sides_caption, unit_of, with_unit, Page};
use crate::record::metrics;
use crate::report::compare::{AaFloor, Mode, Report, Row};
use crate::report::inference::{Comparison, Interval};
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
        render::AA_MARK => "A/A: the noise floor",
        render::WITHIN_FLOOR => "within the A/A floor",
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
        ]);
        if report.has_floors() {
            cols.extend(floor_cols());
        }
        cols.push(Col::text("mark"));
    }
    cols
}

/// The columns of a row's A/A floor: the floor and its interval.
pub(super) fn floor_cols() -> [Col; 3] {
    [
        Col::num("A/A floor (%)"),
        Col::num("A/A CI low (%)"),
        Col::num("A/A CI high (%)"),
    ]
}

/// A row's A/A floor of a metric and its interval (empty without one).
pub(super) fn floor_cells(floor: Option<&AaFloor>) -> [Cell; 3] {
    match floor {
        Some(f) => effect_cells(f.diff_pct, f.ci_pct),
        None => [Cell::text("-"), Cell::text("-"), Cell::text("-")],
    }
}

/// Whether a row's metric is a finding the page shows in bold: significant,
/// beyond the A/A floor, and not the A/A pair compared with itself.
pub(super) fn finding(report: &Report, r: &Row, key: &str, c: &Comparison) -> bool {
    c.outcome.significant && !report.is_aa() && report.within_floor(r, key).is_none()
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
            if report.has_floors() {
                cells.extend(floor_cells(r.aa_floor.get(key)));
            }
            cells.push(mark_cell(render::row_mark(report, r, key, c)));
            t.row_class(cells, finding(report, r, key, c).then_some("sig"));
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
