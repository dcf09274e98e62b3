//! The HTML page of a comparison, `report.html`: one file that works
//! offline (no fetch: a Content-Security-Policy forbids any), a page a
//! reviewer can forward. In order:
//! - the verdict: what each row says in words, and a table of every
//!   significant change (`html/summary.rs`);
//! - the run: kernels, accelerator, QEMU, vCPUs, iterations, blklab's
//!   commit, the host; warnings (measurement artefacts) and failed runs
//!   (`html/summary.rs`);
//! - per metric, a sortable table of the rows beside its bar plot
//!   (`html/metrics.rs`);
//! - per row, what it measures, the differential instruction profile
//!   (tables with the functions' bar plot beside them, `html/profile.rs`)
//!   and the latency and requests-per-kick distributions (`html/rows.rs`);
//! - what differs between the sides (`html/summary.rs`);
//! - every number of report.json, per row (`html/numbers.rs`).
//!
//! A table of contents links each section, metric and row. The plots are
//! inline SVG (also written to `plots/`, `html/plots.rs`); tables
//! (`html/table.rs`) sort by any column with a few lines of plain
//! JavaScript (`html/page.js`).
//!
//! The markup is written with [`maud`]: HTML as a Rust macro, checked when
//! blklab is built, that escapes every interpolated value (a kernel or
//! scenario name is text, never markup). Only the plots' SVG (plotters
//! escapes its text) and the page's own CSS and JavaScript go in as they
//! are, through [`PreEscaped`].

mod metrics;
mod numbers;
mod plots;
mod profile;
mod rows;
mod summary;
mod table;

use std::path::{Path, PathBuf};

use maud::{html, Markup, PreEscaped, DOCTYPE};

use crate::record::metrics as metric_defs;
use crate::report::compare::{Mode, Report, Row, SideInfo};
use crate::report::load::Side;
use crate::report::render;
use crate::report::verdict::judge;

use plots::{A2_COLOR, A_COLOR, B2_COLOR, B_COLOR};
use table::{anchor, Table, Tint};

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
    metric_defs::find(key).map_or("", |m| m.unit)
}

/// A file name made of `s`.
fn file_safe(s: &str) -> String {
    anchor(s)
}

/// The id of a row's section.
fn row_id(r: &Row) -> String {
    anchor(&format!("row-{}", r.name()))
}

/// A heading of the table of contents, with its sub-entries.
struct TocEntry {
    id: String,
    text: String,
    children: Vec<(String, String)>,
}

/// The page being written: the table of contents its sections add to, the
/// plots directory and the files written.
struct Page {
    plots: PathBuf,
    toc: Vec<TocEntry>,
    written: Vec<PathBuf>,
}

impl Page {
    /// A top-level section of `body` (listed in the table of contents;
    /// `body` is made after, so that its sub-sections list under it).
    fn section(
        &mut self,
        id: &str,
        title: &str,
        body: impl FnOnce(&mut Page) -> std::io::Result<Markup>,
    ) -> std::io::Result<Markup> {
        self.toc.push(TocEntry {
            id: id.to_string(),
            text: title.to_string(),
            children: Vec::new(),
        });
        let body = body(self)?;
        Ok(html! { section id=(id) { h2 { (title) } (body) } })
    }

    /// A sub-section of the current section (listed in the table of
    /// contents under it).
    fn sub(&mut self, id: &str, title: &str, body: Markup) -> Markup {
        if let Some(e) = self.toc.last_mut() {
            e.children.push((id.to_string(), title.to_string()));
        }
        html! { section id=(id) { h3 { (title) } (body) } }
    }

    /// The plot `svg` inline as a figure (with `alt` for readers without
    /// sight), and in `plots/NAME`.
    fn figure(&mut self, name: &str, svg: &str, alt: &str) -> std::io::Result<Markup> {
        let f = self.plots.join(name);
        std::fs::write(&f, svg)?;
        self.written.push(f);
        let label = html! { (alt) }.into_string();
        let inline = svg.replacen(
            "<svg ",
            &format!("<svg role=\"img\" aria-label=\"{label}\" "),
            1,
        );
        Ok(html! { figure { (PreEscaped(inline)) } })
    }

    fn toc(&self) -> Markup {
        html! {
            nav id="toc" {
                h2 { "Contents" }
                ol {
                    @for e in &self.toc {
                        li {
                            a href={ "#" (e.id) } { (e.text) }
                            @if !e.children.is_empty() {
                                ol {
                                    @for (id, text) in &e.children {
                                        li { a href={ "#" (id) } { (text) } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A table and, beside it, a figure.
fn beside(table: &Table, figure: Option<Markup>) -> Markup {
    html! { div.pair { div { (table) } div.fig { @if let Some(f) = figure { (f) } } } }
}

/// The heading: what is compared, A and B with their colours.
fn header(report: &Report) -> Markup {
    let side = |tint: &str, letter: &str, s: &SideInfo| {
        html! {
            span class={ "swatch " (tint) } {}
            strong { (letter) }
            " " (s.kernel) " (" (s.kernel_spec) ") in " (s.dir.display().to_string())
        }
    };
    html! {
        header {
            h1 { (render::heading(report)) }
            p {
                @if report.mode == Mode::Variants {
                    span.swatch.a {} strong { "A" } " each pair's base variant, "
                    span.swatch.b {} strong { "B" } " its other variant, on "
                    (side("a", "", &report.a))
                } @else {
                    (side("a", "A", &report.a)) br; (side("b", "B", &report.b))
                }
            }
        }
    }
}

/// A forced comparison's warning, first on the page: the conditions that
/// differ.
fn forced(report: &Report) -> Markup {
    let banner = render::forced_banner(report);
    let Some((first, rest)) = banner.split_first() else {
        return html! {};
    };
    html! {
        div.forced role="alert" {
            p { strong { (first) } }
            ul { @for l in rest { li { (l.trim_start()) } } }
        }
    }
}

/// The records' vCPUs that could not all run at once, after the forced
/// banner: contention between vCPUs cannot show in them.
fn parallelism(report: &Report) -> Markup {
    if report.parallelism_warnings.is_empty() {
        return html! {};
    }
    html! {
        div.parallelism role="note" {
            @for w in &report.parallelism_warnings { p { strong { "Warning: " } (w) } }
        }
    }
}

/// No fetch of any kind; inline styles and scripts only; SVG inline.
const CSP: &str =
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:";

/// The whole document around the sections.
fn document(report: &Report, toc: Markup, main: Markup) -> Markup {
    let vars = format!(
        ":root {{ --a: {}; --b: {}; --a2: {}; --b2: {}; }}",
        plots::hex(A_COLOR),
        plots::hex(B_COLOR),
        plots::hex(A2_COLOR),
        plots::hex(B2_COLOR)
    );
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="Content-Security-Policy" content=(CSP);
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (render::heading(report)) }
                style { (PreEscaped(vars)) "\n" (PreEscaped(include_str!("html/page.css"))) }
            }
            body {
                (header(report))
                (toc)
                main { (main) }
                script { (PreEscaped(include_str!("html/page.js"))) }
            }
        }
    }
}

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
        toc: Vec::new(),
        written: Vec::new(),
    };
    let verdicts = judge(report);
    let main = html! {
        (forced(report))
        (parallelism(report))
        (summary::verdict(&mut page, report, &verdicts)?)
        (summary::run(&mut page, report)?)
        (metrics::section(&mut page, report)?)
        (rows::section(&mut page, report, &verdicts, [a, b])?)
        (summary::differences(&mut page, report)?)
        (summary::coverage(&mut page, report)?)
        (numbers::section(&mut page, report)?)
    };
    let html = document(report, page.toc(), main);
    let path = dir.join("report.html");
    std::fs::write(&path, html.into_string())?;
    let mut written = page.written;
    written.insert(0, path);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::compare;
    use crate::report::load::{self, RunFilter};

    /// The A/A fixture's comparison, with `hostile` in every name the
    /// page shows.
    fn hostile_report(hostile: &str) -> (Report, Side, Side) {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/runs/aa");
        let side = |k: &str| load::load_side(&format!("{dir}:{k}"), RunFilter::default());
        let (a, b) = (side("debian-6.12").unwrap(), side("debian-6.12-2").unwrap());
        let subject = compare::Subject {
            a: &a,
            b: &b,
            pairs: &[],
        };
        let opts = compare::Options {
            confidence: 0.95,
            force: true,
            profile_top: 10,
        };
        let keys = vec!["iops".to_string()];
        let mut report = compare::build::<compare::KernelRows>(&subject, &keys, &opts).unwrap();
        report.a.kernel = hostile.to_string();
        report.b.kernel_spec = hostile.to_string();
        report.forced_over = vec![hostile.to_string()];
        report.parallelism_warnings = vec![hostile.to_string()];
        for r in &mut report.rows {
            r.scenario = hostile.to_string();
            r.about = hostile.to_string();
        }
        report.differences.push(compare::Difference {
            what: hostile.to_string(),
            condition: None,
            a: hostile.to_string(),
            b: hostile.to_string(),
            blocking: false,
            by_design: false,
            within: None,
            rows: vec![hostile.to_string()],
        });
        (report, a, b)
    }

    #[test]
    fn names_are_text_never_markup() {
        let hostile = "<script>alert(\"x\")</script>&";
        let (report, a, b) = hostile_report(hostile);
        let out = tempfile::tempdir().unwrap();
        write(&report, &a, &b, out.path()).unwrap();
        let page = std::fs::read_to_string(out.path().join("report.html")).unwrap();
        assert_eq!(page.matches("<script").count(), 1, "only the page's own");
        assert!(!page.contains("alert(\"x\")"), "quotes escaped too");
        assert!(page.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;"));
        assert!(page.contains("<div class=\"forced\" role=\"alert\">"));
        assert!(page.find("class=\"forced\"") < page.find("id=\"verdict\""));
        let note = page.find("<div class=\"parallelism\" role=\"note\">");
        assert!(note.is_some() && page.find("class=\"forced\"") < note);
        assert!(note < page.find("id=\"verdict\""));
        // Ids made of a name keep only safe characters.
        assert!(page.contains("id=\"row-_script_alert__x____script___read\""));
    }

    #[test]
    fn every_section_is_in_the_contents() {
        let (report, a, b) = hostile_report("smoke");
        let out = tempfile::tempdir().unwrap();
        write(&report, &a, &b, out.path()).unwrap();
        let page = std::fs::read_to_string(out.path().join("report.html")).unwrap();
        for id in [
            "verdict",
            "run",
            "metrics",
            "rows",
            "differences",
            "numbers",
        ] {
            assert!(page.contains(&format!("<a href=\"#{id}\">")), "{id}");
            assert!(page.contains(&format!("<section id=\"{id}\">")), "{id}");
        }
        assert!(page.contains("<a href=\"#metric-iops\">"));
        assert!(page.contains("<table id=\"verdict-changes\" class=\"sortable\">"));
        assert!(page.contains("<table id=\"run-identity\">"));
    }
}
