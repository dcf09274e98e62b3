//! The HTML page of a comparison, `report.html`: one file that works
//! offline (no fetch: a Content-Security-Policy forbids any), a page a
//! reviewer can forward. In order:
//! - the verdict: what each row says in words, and a table of every
//!   significant change;
//! - the run: kernels, accelerator, QEMU, vCPUs, iterations, blklab's
//!   commit, the host; warnings (measurement artefacts) and failed runs;
//! - per metric, a sortable table of the rows beside its bar plot;
//! - per row, what it measures, the differential instruction profile
//!   (tables with the functions' bar plot beside them) and the latency and
//!   requests-per-kick distributions;
//! - what differs between the sides;
//! - every number of report.json, per row.
//!
//! A table of contents links each section, metric and row. The plots are
//! inline SVG (also written to `plots/`); tables sort by any column with a
//! few lines of plain JavaScript (`html/page.js`).

mod plots;
mod table;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::record::metrics;
use crate::report::compare::{DidCell, Mode, Report, Row};
use crate::report::inference::{Comparison, DiffInDiff, Summary};
use crate::report::load::Side;
use crate::report::profile::{Entry, RowProfile};
use crate::report::render;
use crate::report::verdict::{judge, Call, RowVerdict};

use plots::{BarRow, Curve, DiffBar, A2_COLOR, A_COLOR, B2_COLOR, B_COLOR};
use table::{anchor, esc, Cell, Col, Table, Tint};

/// The colours and tints of a report's groups: A, B; with two kernels and
/// pairs A base, A other, B base, B other.
fn groups_style(report: &Report) -> Vec<(plotters::style::RGBColor, Tint)> {
    match report.mode {
        Mode::Did => vec![
            (A_COLOR, Tint::A),
            (A2_COLOR, Tint::A2),
            (B_COLOR, Tint::B),
            (B2_COLOR, Tint::B2),
        ],
        _ => vec![(A_COLOR, Tint::A), (B_COLOR, Tint::B)],
    }
}

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

/// What A and B are, for a table's caption.
fn sides_caption(report: &Report) -> String {
    match report.mode {
        Mode::Kernels => format!(
            "A = {}, B = {}; CI: the {:.0} % confidence interval of the delta",
            report.a.kernel,
            report.b.kernel,
            report.confidence * 100.0
        ),
        Mode::Variants => format!(
            "A = each pair's base variant, B = its other variant, on {}; CI: the {:.0} % \
             confidence interval of the delta",
            report.a.kernel,
            report.confidence * 100.0
        ),
        Mode::Did => format!(
            "each pair's effect (other against base) on A = {} and on B = {}, and the \
             difference in differences; CI: the {:.0} % confidence interval",
            report.a.kernel,
            report.b.kernel,
            report.confidence * 100.0
        ),
    }
}

/// `title (unit)`.
fn with_unit(head: &str, unit: &str) -> String {
    if unit.is_empty() {
        head.to_string()
    } else {
        format!("{head} ({unit})")
    }
}

fn unit_of(key: &str) -> &'static str {
    metrics::find(key).map_or("", |m| m.unit)
}

/// A file name made of `s`.
fn file_safe(s: &str) -> String {
    anchor(s)
}

/// A heading of the table of contents, with its sub-entries.
struct TocEntry {
    id: String,
    text: String,
    children: Vec<(String, String)>,
}

/// The page being written: its sections, the table of contents, the plots
/// directory and the files written.
struct Page {
    plots: PathBuf,
    body: String,
    toc: Vec<TocEntry>,
    written: Vec<PathBuf>,
}

impl Page {
    /// Open a top-level section.
    fn section(&mut self, id: &str, title: &str) {
        self.body
            .push_str(&format!("<section id=\"{id}\">\n<h2>{}</h2>\n", esc(title)));
        self.toc.push(TocEntry {
            id: id.to_string(),
            text: title.to_string(),
            children: Vec::new(),
        });
    }

    fn end_section(&mut self) {
        self.body.push_str("</section>\n");
    }

    /// Open a sub-section of the current section (listed in the table of
    /// contents under it).
    fn sub(&mut self, id: &str, title: &str) {
        self.body
            .push_str(&format!("<section id=\"{id}\">\n<h3>{}</h3>\n", esc(title)));
        if let Some(e) = self.toc.last_mut() {
            e.children.push((id.to_string(), title.to_string()));
        }
    }

    /// The plot `svg` inline as a figure (with `alt` for readers without
    /// sight), and in `plots/NAME`.
    fn figure(&mut self, name: &str, svg: &str, alt: &str) -> std::io::Result<String> {
        let f = self.plots.join(name);
        std::fs::write(&f, svg)?;
        self.written.push(f);
        let inline = svg.replacen(
            "<svg ",
            &format!("<svg role=\"img\" aria-label=\"{}\" ", esc(alt)),
            1,
        );
        Ok(format!("<figure>{inline}</figure>\n"))
    }

    /// A table and, beside it, a figure.
    fn pair(&mut self, table: &str, figure: &str) {
        self.body.push_str(&format!(
            "<div class=\"pair\"><div>{table}</div><div class=\"fig\">{figure}</div></div>\n"
        ));
    }

    fn toc_html(&self) -> String {
        let mut out = String::from("<nav id=\"toc\"><h2>Contents</h2><ol>\n");
        for e in &self.toc {
            out.push_str(&format!("<li><a href=\"#{}\">{}</a>", e.id, esc(&e.text)));
            if !e.children.is_empty() {
                out.push_str("<ol>");
                for (id, text) in &e.children {
                    out.push_str(&format!("<li><a href=\"#{id}\">{}</a></li>", esc(text)));
                }
                out.push_str("</ol>");
            }
            out.push_str("</li>\n");
        }
        out.push_str("</ol></nav>\n");
        out
    }
}

/// The id of a row's section.
fn row_id(r: &Row) -> String {
    anchor(&format!("row-{}", r.name()))
}

/// The heading: what is compared, A and B with their colours.
fn header(report: &Report) -> String {
    let side = |tint: &str, letter: &str, s: &crate::report::compare::SideInfo| {
        format!(
            "<span class=\"swatch {tint}\"></span><strong>{letter}</strong> {} ({}) in {}",
            esc(&s.kernel),
            esc(&s.kernel_spec),
            esc(&s.dir.display().to_string())
        )
    };
    let sides = match report.mode {
        Mode::Variants => format!(
            "<span class=\"swatch a\"></span><strong>A</strong> each pair's base variant, \
             <span class=\"swatch b\"></span><strong>B</strong> its other variant, on {}",
            side("a", "", &report.a)
        ),
        _ => format!(
            "{}<br>{}",
            side("a", "A", &report.a),
            side("b", "B", &report.b)
        ),
    };
    format!(
        "<header><h1>{}</h1><p>{sides}</p></header>\n",
        esc(&render::heading(report))
    )
}

/// The verdict: each row in words, then every significant change.
fn verdict(page: &mut Page, report: &Report, verdicts: &[RowVerdict]) {
    page.section("verdict", "Verdict");
    page.body.push_str(&format!(
        "<p class=\"legend\">* significant: the change survives Holm's correction over every \
         row and metric shown, at {:.0} % confidence; ~ noise: no metric shown changes beyond \
         its run-to-run noise; n&lt;3: too few runs to call. \"In every run\": the runs of the \
         two sides do not overlap.</p>\n",
        report.confidence * 100.0
    ));
    for (v, r) in verdicts.iter().zip(&report.rows) {
        let call = match v.call {
            Call::Significant => "significant",
            Call::Noise => "noise",
            Call::TooFew => "too_few",
        };
        page.body.push_str(&format!(
            "<div class=\"verdict-row\"><a href=\"#{}\"><strong>{}</strong></a> \
             <span class=\"call {call}\">{}</span><br>{}<br><small>{}</small></div>\n",
            row_id(r),
            esc(&v.row),
            esc(v.call.text()),
            esc(&v.words),
            esc(&r.about)
        ));
    }
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
    page.body.push_str(&t.html());
    page.end_section();
}

/// The run: each side's identity, the statistics, the warnings and the
/// failed runs.
fn run(page: &mut Page, report: &Report) {
    page.section("run", "The run");
    let (a, b) = (&report.a, &report.b);
    let mut t = Table::facts(
        "run-identity",
        vec![
            Col::text(""),
            Col::text(format!("A {}", a.kernel)).tint(Tint::A).wrap(),
            Col::text(format!("B {}", b.kernel)).tint(Tint::B).wrap(),
        ],
    );
    let yes = |v: bool| if v { "yes" } else { "no" }.to_string();
    let text_row = |t: &mut Table, what: &str, x: String, y: String| {
        t.row(vec![Cell::text(what), Cell::text(x), Cell::text(y)]);
    };
    text_row(
        &mut t,
        "kernel",
        a.kernel_spec.clone(),
        b.kernel_spec.clone(),
    );
    text_row(
        &mut t,
        "run directory",
        a.dir.display().to_string(),
        b.dir.display().to_string(),
    );
    t.row(vec![
        Cell::text("records"),
        Cell::count(a.records),
        Cell::count(b.records),
    ]);
    text_row(
        &mut t,
        "started",
        a.run.started.clone(),
        b.run.started.clone(),
    );
    text_row(
        &mut t,
        "accelerator",
        a.run.accel.clone(),
        b.run.accel.clone(),
    );
    text_row(
        &mut t,
        "why this accelerator",
        a.run.accel_reason.clone(),
        b.run.accel_reason.clone(),
    );
    text_row(
        &mut t,
        "deterministic (-icount)",
        yes(a.run.deterministic),
        yes(b.run.deterministic),
    );
    text_row(
        &mut t,
        "guest instructions counted",
        yes(a.run.instructions),
        yes(b.run.instructions),
    );
    text_row(&mut t, "QEMU", a.run.qemu.clone(), b.run.qemu.clone());
    text_row(&mut t, "vCPUs", a.run.vcpus.clone(), b.run.vcpus.clone());
    t.row(vec![
        Cell::text("iterations"),
        Cell::count(a.run.iterations as usize),
        Cell::count(b.run.iterations as usize),
    ]);
    text_row(
        &mut t,
        "blklab (commit)",
        a.run.blklab.clone(),
        b.run.blklab.clone(),
    );
    text_row(&mut t, "host", a.run.host.clone(), b.run.host.clone());
    page.body.push_str(&t.html());
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
    page.body.push_str(&s.html());
    warnings(page, report);
    failed(page, report);
    page.end_section();
}

/// Every profile's measurement-artefact warnings, in one table.
fn warnings(page: &mut Page, report: &Report) {
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
    if t.is_empty() {
        page.body
            .push_str("<p>No measurement artefact near the top of any profile.</p>\n");
    } else {
        page.body
            .push_str(&format!("<div class=\"warning\">{}</div>", t.html()));
    }
}

/// Runs left out because they failed, per row.
fn failed(page: &mut Page, report: &Report) {
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
    page.body.push_str(&t.html());
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

/// A metric's table: one line per row.
fn metric_table(report: &Report, key: &str) -> Table {
    let unit = unit_of(key);
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

/// delta, CI low, CI high.
fn effect_cells(delta: f64, ci: Option<crate::report::inference::Interval>) -> [Cell; 3] {
    [
        Cell::pct(delta),
        Cell::opt(ci.map(|i| i.lo), Cell::pct),
        Cell::opt(ci.map(|i| i.hi), Cell::pct),
    ]
}

/// Each metric: its table beside its bars.
fn metrics_section(page: &mut Page, report: &Report) -> std::io::Result<()> {
    page.section("metrics", "Metrics");
    let style = groups_style(report);
    let series: Vec<(String, plotters::style::RGBColor)> = series_labels(report)
        .into_iter()
        .zip(style.iter().map(|s| s.0))
        .collect();
    for key in &report.metrics {
        let t = metric_table(report, key);
        if t.is_empty() {
            continue;
        }
        let title = render::title_of(key);
        page.sub(&anchor(&format!("metric-{key}")), &title);
        let rows: Vec<BarRow> = report
            .rows
            .iter()
            .filter(|r| {
                r.groups
                    .iter()
                    .all(|g| g.samples.contains_key(key.as_str()))
            })
            .map(|r| {
                (
                    r.name(),
                    r.groups
                        .iter()
                        .map(|g| g.samples.get(key.as_str()))
                        .collect(),
                )
            })
            .collect();
        let figure = if rows.is_empty() {
            String::new()
        } else {
            let m = metrics::find(key).expect("checked metric");
            let svg = plots::bars(
                &format!("{}: mean, 95 % CI of the mean", with_unit(m.title, m.unit)),
                &rows,
                &series,
            )?;
            page.figure(&format!("metric-{}.svg", file_safe(key)), &svg, &title)?
        };
        page.pair(&t.html(), &figure);
        page.body.push_str("</section>\n");
    }
    page.body.push_str(&format!(
        "<p class=\"legend\">{}</p>\n",
        esc(&render::legend(report))
    ));
    page.end_section();
    Ok(())
}

/// Columns of a profile table: name (and group), each side's mean, sd,
/// n, min and max, B − A and the exactness mark.
fn profile_cols(first: &str, group: bool) -> Vec<Col> {
    let mut cols = vec![Col::text(first)];
    if group {
        cols.push(Col::text("group"));
    }
    for (s, tint) in [("A", Tint::A), ("B", Tint::B)] {
        cols.extend([
            Col::num(format!("{s} mean")).tint(tint),
            Col::num("sd").tint(tint),
            Col::num("n").tint(tint),
            Col::num("min").tint(tint),
            Col::num("max").tint(tint),
        ]);
    }
    cols.push(Col::num("B − A"));
    cols.push(Col::text("exact (=)"));
    cols
}

/// A profile table of `entries`.
fn profile_table(
    id: &str,
    caption: &str,
    first: &str,
    entries: &[Entry],
    group: bool,
    p: &RowProfile,
) -> Table {
    let caption = format!("{caption} (A = {}, B = {})", p.a_label, p.b_label);
    let mut t = Table::new(id, profile_cols(first, group)).caption(caption);
    for e in entries {
        let mut cells = vec![Cell::text(&e.name)];
        if group {
            cells.push(Cell::text(&e.group));
        }
        for s in [&e.a, &e.b] {
            cells.extend([
                Cell::num(s.mean),
                Cell::num(s.sd),
                Cell::count(s.n),
                Cell::num(s.min),
                Cell::num(s.max),
            ]);
        }
        cells.push(Cell::Num(e.diff, format!("{:+.1}", e.diff)));
        cells.push(Cell::text(if e.separated { "=" } else { "" }));
        t.row(cells);
    }
    t
}

/// The foot of a function table: how many functions were left out and
/// the sum of every function's difference.
fn functions_foot(t: &mut Table, group: bool, more: usize, sum: f64) {
    let mut cells = vec![Cell::Num(
        more as f64,
        format!("{more} more functions differ; B − A over all of them:"),
    )];
    if group {
        cells.push(Cell::text(""));
    }
    cells.extend((0..10).map(|_| Cell::text("")));
    cells.push(Cell::Num(sum, format!("{sum:+.1}")));
    cells.push(Cell::text("all"));
    t.foot(cells);
}

/// A row's differential profile: warnings, totals, groups and functions
/// (with their plot beside), and the host's when there is one.
fn profile(page: &mut Page, p: &RowProfile) -> std::io::Result<()> {
    let base = anchor(&format!("profile-{}", p.title()));
    page.body.push_str(&format!(
        "<h4>Differential instruction profile{}</h4>\n<p class=\"legend\">Guest instructions \
         per IO, mean, sd, n, min and max over the runs of each side (A = {}, B = {}); \
         functions from the kernel's System.map, grouped by name; = every run of one side \
         beyond every run of the other.</p>\n",
        p.kernel
            .as_ref()
            .map_or(String::new(), |k| format!(" on {}", esc(k))),
        esc(&p.a_label),
        esc(&p.b_label)
    ));
    for w in &p.warnings {
        page.body.push_str(&format!(
            "<p class=\"warning\"><strong>{}</strong></p>\n",
            esc(&crate::report::profile::warning_line(
                w, &p.a_label, &p.b_label
            ))
        ));
    }
    let totals = profile_table(
        &format!("{base}-totals"),
        "per IO",
        "per IO",
        &p.totals,
        false,
        p,
    );
    let groups = profile_table(
        &format!("{base}-groups"),
        "kernel instructions per IO by group",
        "group",
        &p.groups,
        false,
        p,
    );
    page.body.push_str(&totals.html());
    page.body.push_str(&groups.html());
    let mut functions = profile_table(
        &format!("{base}-functions"),
        "kernel instructions per IO by function: the largest differences",
        "function",
        &p.functions,
        true,
        p,
    );
    functions_foot(&mut functions, true, p.more_functions, p.functions_diff_sum);
    let figure = if p.functions.is_empty() {
        String::new()
    } else {
        let bars: Vec<DiffBar> = p
            .functions
            .iter()
            .map(|e| DiffBar {
                name: e.name.clone(),
                diff: e.diff,
                spread: e.a.sd + e.b.sd,
            })
            .collect();
        let svg = plots::diff_bars(
            &format!("{}: kernel instructions per IO, B − A", p.title()),
            "instructions per IO (B − A); whiskers: sd(A) + sd(B)",
            &bars,
            [&p.a_label, &p.b_label],
        )?;
        page.figure(&format!("{}.svg", file_safe(&base)), &svg, "profile")?
    };
    page.pair(&functions.html(), &figure);
    if !p.modelled.is_empty() {
        page.body.push_str(
            "<h4>Modelled host cost (not measured)</h4>\n<p class=\"legend\">What a KVM host \
             would spend per IO on this guest: its instructions, plus each would-be exit \
             times the host instructions one such exit cost in the nested lab's calibration \
             (the weight in brackets), plus halt polling in µs. A model: see the user \
             guide's <em>Modelled host cost</em>.</p>\n",
        );
        let table = profile_table(
            &format!("{base}-modelled"),
            "MODELLED host instructions per IO",
            "modelled per IO",
            &p.modelled,
            false,
            p,
        );
        page.body.push_str(&table.html());
    }
    if let Some(h) = &p.host {
        page.body
            .push_str("<h4>The host's profile (nested run)</h4>\n");
        let totals = profile_table(
            &format!("{base}-host-totals"),
            "host per IO",
            "host per IO",
            &h.totals,
            false,
            p,
        );
        let groups = profile_table(
            &format!("{base}-host-groups"),
            "host kernel instructions per IO by group",
            "host group",
            &h.groups,
            false,
            p,
        );
        let mut functions = profile_table(
            &format!("{base}-host-functions"),
            "host kernel instructions per IO by function",
            "host function",
            &h.functions,
            true,
            p,
        );
        functions_foot(&mut functions, true, h.more_functions, h.functions_diff_sum);
        for t in [totals, groups, functions] {
            page.body.push_str(&t.html());
        }
    }
    Ok(())
}

/// A group's points in one plot, from its side's records of its
/// (scenario, variant).
type GroupPoints = fn(&Side, &str, &str) -> Vec<(f64, f64)>;

/// Each row: what it measures, its verdict, its profile(s) and its
/// distributions.
fn rows_section(
    page: &mut Page,
    report: &Report,
    verdicts: &[RowVerdict],
    sides: [&Side; 2],
) -> std::io::Result<()> {
    page.section("rows", "Scenarios");
    let style = groups_style(report);
    for (r, v) in report.rows.iter().zip(verdicts) {
        let name = r.name();
        page.sub(&row_id(r), &name);
        page.body.push_str(&format!(
            "<p>{}</p>\n<p><strong>{}</strong>: {}</p>\n",
            esc(&r.about),
            esc(v.call.text()),
            esc(&v.words)
        ));
        for p in report
            .profiles
            .iter()
            .filter(|p| p.scenario == r.scenario && p.variant == r.variant && p.pair == r.pair)
        {
            profile(page, p)?;
        }
        let curves = |points: GroupPoints| -> Vec<Curve> {
            r.groups
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let pts = points(sides[g.side], &g.scenario, &g.variant);
                    (pts, style[i.min(style.len() - 1)].0, g.label.clone())
                })
                .collect()
        };
        let base = file_safe(&match &r.pair {
            None => format!("{}-{}", r.scenario, r.variant),
            Some(_) => name.clone(),
        });
        let mut figures = String::new();
        // Latency on x, percentile on y: the curve reads as a CDF.
        let lat = curves(|s, sc, v| swap(&latency_curve(s, sc, v)));
        if let Some(svg) = plots::overlay(
            &format!("{name}: fio completion latency"),
            "latency (µs)",
            "percentile",
            &lat,
            true,
        )? {
            figures.push_str(&page.figure(&format!("latency-{base}.svg"), &svg, "latency")?);
        }
        if let Some(svg) = plots::overlay(
            &format!("{name}: requests per kick"),
            "requests per kick",
            "share of kicks",
            &curves(kick_distribution),
            false,
        )? {
            figures.push_str(&page.figure(
                &format!("requests-per-kick-{base}.svg"),
                &svg,
                "requests per kick",
            )?);
        }
        if !figures.is_empty() {
            page.body.push_str("<h4>Distributions</h4>\n");
            page.body
                .push_str(&format!("<div class=\"pair\">{figures}</div>\n"));
        }
        page.body.push_str("</section>\n");
    }
    page.end_section();
    Ok(())
}

/// A forced comparison's warning, first on the page: the conditions that
/// differ.
fn forced(page: &mut Page, report: &Report) {
    let banner = render::forced_banner(report);
    let Some((first, rest)) = banner.split_first() else {
        return;
    };
    page.body.push_str(&format!(
        "<div class=\"forced\" role=\"alert\"><p><strong>{}</strong></p><ul>\n",
        table::esc(first)
    ));
    for l in rest {
        page.body
            .push_str(&format!("<li>{}</li>\n", table::esc(l.trim_start())));
    }
    page.body.push_str("</ul></div>\n");
}

/// `--coverage`: the would-be exits beside a nested run's KVM exits.
fn coverage(page: &mut Page, report: &Report) {
    let Some(c) = &report.coverage else { return };
    page.section("coverage", "Would-be exits against KVM's exits");
    let lines = crate::report::coverage::lines(c);
    page.body.push_str("<ul>\n");
    for l in &lines {
        page.body
            .push_str(&format!("<li>{}</li>\n", esc(l.trim_start())));
    }
    page.body.push_str("</ul>\n");
    page.end_section();
}

/// What differs between the sides besides the kernel, and how each pair's
/// variants differ by design.
fn differences(page: &mut Page, report: &Report) {
    page.section("differences", "What differs besides the kernel");
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
    if t.is_empty() {
        page.body.push_str(
            "<p>Nothing: every condition of the comparability contract (accelerator, \
             --deterministic, instruction counting, vCPUs, memory, kernel command line, QEMU, \
             scenario, backend, guest image, blklab version) and the host are the same.</p>\n",
        );
    } else {
        page.body.push_str(&t.html());
    }
    page.end_section();
}

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

/// A comparison's test: delta, interval, method, p, significant, noisy.
fn test_cells(c: &Comparison) -> Vec<Cell> {
    let mut v: Vec<Cell> = effect_cells(c.delta_pct, c.ci_pct).into();
    v.extend([
        Cell::text(render::method(c.outcome.method)),
        Cell::p(c.outcome.p_value),
        Cell::text(if c.outcome.significant { "yes" } else { "no" }),
        Cell::text(if c.outcome.noisy { "yes" } else { "no" }),
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
fn numbers(page: &mut Page, report: &Report) {
    page.section("numbers", "Every number");
    page.body.push_str(
        "<p class=\"legend\">Every metric each row has data for, whether shown above or not \
         (report.json holds the same). p-values are before Holm's correction; \"significant\" \
         is after it, for the metrics shown.</p>\n",
    );
    for r in &report.rows {
        page.sub(&anchor(&format!("numbers-{}", r.name())), &r.name());
        if report.mode == Mode::Did {
            did_numbers(page, report, r);
            page.body.push_str("</section>\n");
            continue;
        }
        let mut cols = vec![Col::text("metric"), Col::text("unit")];
        cols.extend(summary_cols("A", Tint::A, ""));
        cols.extend(summary_cols("B", Tint::B, ""));
        cols.extend(test_cols());
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
            t.row_class(cells, c.outcome.significant.then_some("sig"));
        }
        page.body.push_str(&t.html());
        page.body.push_str("</section>\n");
    }
    page.end_section();
}

/// A difference-in-differences row's numbers: each kernel's pair effect
/// (both groups' summaries and the test), then the DiD.
fn did_numbers(page: &mut Page, report: &Report, r: &Row) {
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
    page.body.push_str(&t.html());
    page.body.push_str(&d.html());
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
        Cell::text(if x.outcome.significant { "yes" } else { "no" }),
        Cell::text(if x.outcome.noisy { "yes" } else { "no" }),
    ]);
    v
}

/// Mean fio completion-latency percentiles (percentile → µs) of a side's
/// records for one row, in the direction with most IOs.
fn latency_curve(side: &Side, scenario: &str, variant: &str) -> Vec<(f64, f64)> {
    let mut acc: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for r in side
        .records
        .iter()
        .filter(|r| r.scenario == scenario && r.variant == variant && r.ok)
    {
        let Some(job) = r.guest.fio.as_ref().and_then(|f| f.jobs.first()) else {
            continue;
        };
        let Some(dir) = job.busiest() else {
            continue;
        };
        if let Some(c) = &dir.clat_ns {
            for (k, v) in &c.percentile {
                if let Some(ns) = v.as_f64() {
                    let e = acc.entry(k.clone()).or_insert((0.0, 0));
                    e.0 += ns / 1000.0;
                    e.1 += 1;
                }
            }
        }
    }
    let mut out: Vec<(f64, f64)> = acc
        .into_iter()
        .filter_map(|(k, (sum, n))| Some((k.parse::<f64>().ok()?, sum / n as f64)))
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// A side's requests-per-kick distribution for one row: value → share of
/// kicks, over every queue, disk and iteration.
fn kick_distribution(side: &Side, scenario: &str, variant: &str) -> Vec<(f64, f64)> {
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    for r in side
        .records
        .iter()
        .filter(|r| r.scenario == scenario && r.variant == variant && r.ok)
    {
        for q in r.backend.iter().flat_map(|b| b.queues()) {
            for &(v, n) in &q.requests_per_kick_values {
                *counts.entry(v).or_default() += n;
            }
        }
    }
    let total: u64 = counts.values().sum();
    if total == 0 {
        return Vec::new();
    }
    counts
        .into_iter()
        .map(|(v, n)| (v as f64, n as f64 / total as f64))
        .collect()
}

/// Latency points as (latency µs, percentile) for plotting.
pub(crate) fn swap(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points.iter().map(|(p, l)| (*l, *p)).collect()
}

/// No fetch of any kind; inline styles and scripts only; SVG inline.
const CSP: &str =
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:";

/// Write `dir/report.html` and `dir/plots/*.svg`; returns the files written.
pub(crate) fn write(
    report: &Report,
    a: &Side,
    b: &Side,
    dir: &Path,
) -> std::io::Result<Vec<PathBuf>> {
    let plots = dir.join("plots");
    std::fs::create_dir_all(&plots)?;
    let mut page = Page {
        plots,
        body: String::new(),
        toc: Vec::new(),
        written: Vec::new(),
    };
    let verdicts = judge(report);
    forced(&mut page, report);
    verdict(&mut page, report, &verdicts);
    run(&mut page, report);
    metrics_section(&mut page, report)?;
    rows_section(&mut page, report, &verdicts, [a, b])?;
    differences(&mut page, report);
    coverage(&mut page, report);
    numbers(&mut page, report);
    let vars = format!(
        ":root {{ --a: {}; --b: {}; --a2: {}; --b2: {}; }}",
        plots::hex(A_COLOR),
        plots::hex(B_COLOR),
        plots::hex(A2_COLOR),
        plots::hex(B2_COLOR)
    );
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>\n{vars}\n{}</style>\n</head><body>\n{}{}<main>\n{}</main>\n\
         <script>\n{}</script>\n</body></html>\n",
        esc(&render::heading(report)),
        include_str!("html/page.css"),
        header(report),
        page.toc_html(),
        page.body,
        include_str!("html/page.js"),
    );
    let path = dir.join("report.html");
    std::fs::write(&path, html)?;
    let mut written = page.written;
    written.insert(0, path);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_points() {
        assert_eq!(swap(&[(50.0, 120.0)]), vec![(120.0, 50.0)]);
    }
}
