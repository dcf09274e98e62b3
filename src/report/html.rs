//! The HTML page of a comparison with its SVG plots (plotters):
//! - per metric, bars of each side's mean per scenario row, with whiskers of
//!   the 95 % interval of that side's mean;
//! - per row, the two sides' fio completion-latency distributions overlaid
//!   (percentile against latency, log scale);
//! - per row, the two sides' requests-per-kick distributions overlaid (the
//!   fingerprint of a plugged versus an unplugged guest).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use thiserror::Error;

use crate::record::metrics;
use crate::report::compare::{Mode, Report};
use crate::report::inference;
use crate::report::load::Side;
use crate::report::render;

const A_COLOR: RGBColor = RGBColor(31, 119, 180);
const B_COLOR: RGBColor = RGBColor(255, 127, 14);
/// One colour per group of a row: A, B; with two kernels and pairs A base,
/// A other, B base, B other.
const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(174, 199, 232),
    RGBColor(255, 127, 14),
    RGBColor(255, 187, 120),
];
const PAIR_COLORS: [RGBColor; 4] = [A_COLOR, B_COLOR, A_COLOR, B_COLOR];

fn colors(report: &Report) -> &'static [RGBColor; 4] {
    if report.mode == Mode::Did {
        &COLORS
    } else {
        &PAIR_COLORS
    }
}

/// The legend of the series in a metric's bars: kernels, or with pairs
/// what A and B are.
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

/// A plot that plotters could not draw: what was being drawn, and why.
#[derive(Debug, Error)]
#[error("{what}: {source:?}")]
struct PlotError {
    what: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// Plotters' error while drawing `what`, as the I/O error of the page.
fn plot_err<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
) -> impl Fn(E) -> std::io::Error {
    move |e| {
        std::io::Error::other(PlotError {
            what,
            source: Box::new(e),
        })
    }
}

/// Half-width of the 95 % interval of a mean (0 with one sample).
fn half_width(v: &[f64]) -> f64 {
    let s = inference::summarize(v);
    if s.n < 2 {
        return 0.0;
    }
    inference::t_quantile(0.95, (s.n - 1) as f64) * s.sd / (s.n as f64).sqrt()
}

fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Bars with whiskers for one metric over every row: one bar per group
/// of the row (A and B; with two kernels and pairs, four).
fn bars(report: &Report, key: &str, path: &Path) -> std::io::Result<bool> {
    let m = metrics::find(key).expect("checked metric");
    let rows: Vec<(String, Vec<Option<&Vec<f64>>>)> = report
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
        return Ok(false);
    }
    let series = series_labels(report);
    let k = series.len();
    let mut ymax: f64 = 0.0;
    for (_, groups) in &rows {
        for v in groups.iter().flatten() {
            let s = inference::summarize(v);
            ymax = ymax.max(s.mean + half_width(v)).max(s.max);
        }
    }
    let ymax = if ymax > 0.0 { ymax * 1.15 } else { 1.0 };
    let width = (160 + 45 * (k as u32) * rows.len() as u32).max(480);
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err("fill"))?;
    let title = if m.unit.is_empty() {
        m.title.to_string()
    } else {
        format!("{} ({})", m.title, m.unit)
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(&title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..rows.len() as f64 - 0.5, 0f64..ymax)
        .map_err(plot_err("chart"))?;
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len().max(1))
        .x_label_formatter(&|x| {
            // Bars are centred on integer positions; label only those.
            if (x - x.round()).abs() > 1e-6 || x.round() < 0.0 {
                return String::new();
            }
            names.get(x.round() as usize).cloned().unwrap_or_default()
        })
        .y_desc(&title)
        .draw()
        .map_err(plot_err("mesh"))?;
    // k bars in 0.72 of each slot, centred on the slot.
    let w = 0.72 / k as f64;
    for (side, label) in series.iter().enumerate() {
        let color = colors(report)[side.min(3)];
        let mut first = true;
        for (i, (_, groups)) in rows.iter().enumerate() {
            let Some(v) = groups.get(side).copied().flatten() else {
                continue;
            };
            let s = inference::summarize(v);
            let x0 = i as f64 - 0.36 + side as f64 * w;
            let x1 = x0 + w * 0.9;
            let drawn = chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, 0.0), (x1, s.mean)],
                    color.filled(),
                )))
                .map_err(plot_err("bar"))?;
            if first {
                drawn.label(label.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
                first = false;
            }
            let hw = half_width(v);
            if hw > 0.0 {
                let xm = (x0 + x1) / 2.0;
                chart
                    .draw_series(std::iter::once(ErrorBar::new_vertical(
                        xm,
                        (s.mean - hw).max(0.0),
                        s.mean,
                        s.mean + hw,
                        BLACK.stroke_width(1),
                        8,
                    )))
                    .map_err(plot_err("whisker"))?;
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err("legend"))?;
    root.present().map_err(plot_err("write"))?;
    Ok(true)
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

/// One curve of an overlay: its points, colour and legend.
type Curve<'a> = (Vec<(f64, f64)>, RGBColor, &'a str);

/// Overlaid curves.
fn overlay(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    curves: &[Curve],
    log_x: bool,
) -> std::io::Result<bool> {
    if curves.iter().all(|c| c.0.is_empty()) {
        return Ok(false);
    }
    let all = curves.iter().flat_map(|c| c.0.iter());
    let (mut xmin, mut xmax, mut ymax) = (f64::INFINITY, 0f64, 0f64);
    for (x, y) in all {
        xmin = xmin.min(*x);
        xmax = xmax.max(*x);
        ymax = ymax.max(*y);
    }
    let root = SVGBackend::new(path, (640, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err("fill"))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(45)
        .y_label_area_size(60);
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .draw()
                .map_err(plot_err("mesh"))?;
            for (pts, color, label) in curves {
                let color = *color;
                if pts.is_empty() {
                    continue;
                }
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                    .map_err(plot_err("line"))?
                    .label(label.to_string())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
                chart
                    .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(plot_err("points"))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(plot_err("legend"))?;
        }};
    }
    let ytop = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    if log_x {
        let lo = (xmin * 0.8).max(1e-3);
        let hi = (xmax * 1.25).max(lo * 10.0);
        finish!(builder
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..ytop)
            .map_err(plot_err("chart"))?);
    } else {
        let hi = if xmax > xmin { xmax + 1.0 } else { xmin + 2.0 };
        finish!(builder
            .build_cartesian_2d((xmin - 1.0).max(0.0)..hi, 0f64..ytop)
            .map_err(plot_err("chart"))?);
    }
    root.present().map_err(plot_err("write"))?;
    Ok(true)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Horizontal bars of the top functions' per-IO difference (B − A) of one
/// row's differential instruction profile, with each side's sd as whiskers.
fn profile_bars(p: &crate::report::profile::RowProfile, path: &Path) -> std::io::Result<bool> {
    let list = &p.functions;
    if list.is_empty() {
        return Ok(false);
    }
    let lo = list
        .iter()
        .map(|e| e.diff - e.a.sd - e.b.sd)
        .fold(0.0f64, f64::min);
    let hi = list
        .iter()
        .map(|e| e.diff + e.a.sd + e.b.sd)
        .fold(0.0f64, f64::max);
    let pad = ((hi - lo) * 0.08).max(1.0);
    let height = (90 + 26 * list.len() as u32).max(240);
    let root = SVGBackend::new(path, (820, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err("fill"))?;
    let n = list.len();
    let names: Vec<String> = list.iter().map(|e| e.name.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: kernel instructions per IO, B - A", p.title()),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(260)
        .build_cartesian_2d((lo - pad)..(hi + pad), -0.5f64..n as f64 - 0.5)
        .map_err(plot_err("chart"))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|y| {
            if (y - y.round()).abs() > 1e-6 || y.round() < 0.0 {
                return String::new();
            }
            // The largest difference on top.
            let i = n as i64 - 1 - y.round() as i64;
            usize::try_from(i)
                .ok()
                .and_then(|i| names.get(i).cloned())
                .unwrap_or_default()
        })
        .x_desc("instructions per IO (B - A); whiskers: sd(A) + sd(B)")
        .draw()
        .map_err(plot_err("mesh"))?;
    for (i, e) in list.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let color = if e.diff >= 0.0 { B_COLOR } else { A_COLOR };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y - 0.35), (e.diff, y + 0.35)],
                color.filled(),
            )))
            .map_err(plot_err("bar"))?;
        let spread = e.a.sd + e.b.sd;
        if spread > 0.0 {
            chart
                .draw_series(std::iter::once(ErrorBar::new_horizontal(
                    y,
                    e.diff - spread,
                    e.diff,
                    e.diff + spread,
                    BLACK.stroke_width(1),
                    8,
                )))
                .map_err(plot_err("whisker"))?;
        }
    }
    root.present().map_err(plot_err("write"))?;
    Ok(true)
}

/// A group's points in one plot, from its side's records of its
/// (scenario, variant).
type GroupPoints = fn(&Side, &str, &str) -> Vec<(f64, f64)>;

/// The page being written: its body so far and the files written.
struct Page {
    plots: PathBuf,
    body: String,
    written: Vec<PathBuf>,
}

impl Page {
    /// Show the plot written to `file` as a figure.
    fn figure(&mut self, file: PathBuf, alt: &str) {
        self.body.push_str(&format!(
            "<figure><img src=\"plots/{}\" alt=\"{}\"></figure>\n",
            esc(&file.file_name().unwrap_or_default().to_string_lossy()),
            esc(alt)
        ));
        self.written.push(file);
    }

    /// The heading, what A and B are, and the text table.
    fn heading(&mut self, report: &Report) {
        let sides = match report.mode {
            Mode::Variants => format!(
                "A: each pair's base variant, B: its other variant, on {} in {}; {:.0}% confidence",
                report.a.kernel_spec,
                report.a.dir.display(),
                report.confidence * 100.0
            ),
            _ => format!(
                "A: {} in {}; B: {} in {}; {:.0}% confidence",
                report.a.kernel_spec,
                report.a.dir.display(),
                report.b.kernel_spec,
                report.b.dir.display(),
                report.confidence * 100.0
            ),
        };
        self.body.push_str(&format!(
            "<h1>{}</h1>\n<p>{}</p>\n",
            esc(&render::heading(report)),
            esc(&sides)
        ));
        let table = render::table(report);
        self.body.push_str(&format!("<pre>{}</pre>\n", esc(&table)));
    }

    /// Each metric's bars.
    fn metrics(&mut self, report: &Report) -> std::io::Result<()> {
        self.body.push_str("<h2>Metrics</h2>\n");
        for key in &report.metrics {
            let f = self.plots.join(format!("metric-{}.svg", file_safe(key)));
            if bars(report, key, &f)? {
                self.figure(f, key);
            }
        }
        Ok(())
    }

    /// Each row's differential instruction profile, with its warnings.
    fn profiles(&mut self, report: &Report) -> std::io::Result<()> {
        if report.profiles.is_empty() {
            return Ok(());
        }
        self.body
            .push_str("<h2>Differential instruction profile</h2>\n");
        for p in &report.profiles {
            for w in &p.warnings {
                self.body.push_str(&format!(
                    "<p class=\"warning\"><strong>{}</strong>: {}</p>\n",
                    esc(&p.title()),
                    esc(&crate::report::profile::warning_line(
                        w, &p.a_label, &p.b_label
                    ))
                ));
            }
            let name = match &p.pair {
                None => format!("{}-{}", p.scenario, p.variant),
                Some(_) => p.title(),
            };
            let f = self.plots.join(format!("profile-{}.svg", file_safe(&name)));
            if profile_bars(p, &f)? {
                self.figure(f, "profile");
            }
        }
        Ok(())
    }

    /// Each row's latency and requests-per-kick distributions, a curve per
    /// group of the row.
    fn distributions(&mut self, report: &Report, sides: [&Side; 2]) -> std::io::Result<()> {
        self.body.push_str("<h2>Distributions per scenario</h2>\n");
        let palette = colors(report);
        for r in &report.rows {
            let name = r.name();
            let base = match &r.pair {
                None => file_safe(&format!("{}-{}", r.scenario, r.variant)),
                Some(_) => file_safe(&name),
            };
            self.body.push_str(&format!("<h3>{}</h3>\n", esc(&name)));
            let curves = |points: GroupPoints| -> Vec<Curve> {
                r.groups
                    .iter()
                    .enumerate()
                    .map(|(i, g)| {
                        let p = points(sides[g.side], &g.scenario, &g.variant);
                        (p, palette[i.min(3)], g.label.as_str())
                    })
                    .collect()
            };
            let lat = self.plots.join(format!("latency-{base}.svg"));
            let title = format!("{name}: fio completion latency");
            // Latency on x, percentile on y: the curve reads as a CDF.
            let lat_curves = curves(|s, sc, v| swap(&latency_curve(s, sc, v)));
            if overlay(
                &lat,
                &title,
                "latency (µs)",
                "percentile",
                &lat_curves,
                true,
            )? {
                self.figure(lat, "latency");
            }
            let kick = self.plots.join(format!("requests-per-kick-{base}.svg"));
            let title = format!("{name}: requests per kick");
            let (x, y) = ("requests per kick", "share of kicks");
            if overlay(&kick, &title, x, y, &curves(kick_distribution), false)? {
                self.figure(kick, "requests per kick");
            }
        }
        Ok(())
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
        body: String::new(),
        written: Vec::new(),
    };
    page.heading(report);
    page.metrics(report)?;
    page.profiles(report)?;
    page.distributions(report, [a, b])?;
    let body = page.body;
    let html = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>blklab compare</title>\n\
         <style>body{{font-family:sans-serif;margin:2em}}pre{{font-size:12px}}figure{{display:inline-block;margin:0.5em}}.warning{{color:#a00}}</style>\n\
         </head><body>\n{body}</body></html>\n"
    );
    let path = dir.join("report.html");
    std::fs::write(&path, html)?;
    let mut written = page.written;
    written.insert(0, path);
    Ok(written)
}

/// Latency points as (latency µs, percentile) for plotting.
pub(crate) fn swap(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points.iter().map(|(p, l)| (*l, *p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_points() {
        assert_eq!(swap(&[(50.0, 120.0)]), vec![(120.0, 50.0)]);
    }

    #[test]
    fn half_width_uses_t() {
        assert_eq!(half_width(&[1.0]), 0.0);
        let hw = half_width(&[1.0, 2.0, 3.0]);
        // t(0.975, 2) = 4.303, sd = 1, n = 3.
        assert!((hw - 4.303 / 3f64.sqrt()).abs() < 1e-3, "{hw}");
    }
}
