//! The report page's SVG plots (plotters), each returned as SVG text:
//! - per metric, horizontal bars of each group's mean per row (one row of
//!   bars per table row, in the table's order), from zero, with whiskers of
//!   the 95 % interval of that group's mean;
//! - per row, the differential profile's functions: bars of B − A from
//!   zero, whiskers sd(A) + sd(B);
//! - per row, the groups' fio completion-latency distributions and
//!   requests-per-kick distributions overlaid.
//!
//! Every legend is drawn below the plotting area, never over it, and the
//! colours of A and B are the ones the page's tables use.

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;
use thiserror::Error;

use crate::report::inference;
use crate::util::text::num;

/// A, B and, with two kernels and pairs, A's other and B's other variant.
pub(crate) const A_COLOR: RGBColor = RGBColor(31, 119, 180);
pub(crate) const B_COLOR: RGBColor = RGBColor(255, 127, 14);
pub(crate) const A2_COLOR: RGBColor = RGBColor(140, 190, 230);
pub(crate) const B2_COLOR: RGBColor = RGBColor(255, 190, 125);

/// `#rrggbb`, for the page's styles.
pub(crate) fn hex(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// A plot that plotters could not draw: what was being drawn, and why.
#[derive(Debug, Error)]
#[error("{what}: {source:?}")]
pub(crate) struct PlotError {
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

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Height of the legend strip under a plot.
const LEGEND_H: u32 = 28;

/// The legend, in one line below the plotting area: a swatch and a label
/// per series.
fn legend(area: &Area, items: &[(String, RGBColor)]) -> std::io::Result<()> {
    let style = ("sans-serif", 13).into_font().color(&BLACK);
    let mut x = 12i32;
    for (label, color) in items {
        area.draw(&Rectangle::new([(x, 8), (x + 14, 20)], color.filled()))
            .map_err(plot_err("legend swatch"))?;
        area.draw(&Text::new(label.clone(), (x + 20, 8), style.clone()))
            .map_err(plot_err("legend label"))?;
        x += 20 + 8 * label.chars().count() as i32 + 24;
    }
    Ok(())
}

/// Draw with `f` on a `w` × `h` canvas whose bottom strip holds the
/// legend `items`; the SVG text.
fn canvas(
    w: u32,
    h: u32,
    items: &[(String, RGBColor)],
    f: impl FnOnce(&Area) -> std::io::Result<()>,
) -> std::io::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w, h + LEGEND_H)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err("fill"))?;
        let (plot, strip) = root.split_vertically(h);
        f(&plot)?;
        legend(&strip, items)?;
        root.present().map_err(plot_err("write"))?;
    }
    Ok(svg)
}

/// Half-width of the 95 % interval of a mean (0 with one sample).
pub(crate) fn half_width(v: &[f64]) -> f64 {
    let s = inference::summarize(v);
    if s.n < 2 {
        return 0.0;
    }
    inference::t_quantile(0.95, (s.n - 1) as f64) * s.sd / (s.n as f64).sqrt()
}

/// One row of a metric's bars: its name and each group's samples.
pub(crate) type BarRow<'a> = (String, Vec<Option<&'a Vec<f64>>>);

/// Horizontal bars from zero, one per group of each row (rows top to
/// bottom in the given order), whiskers of the 95 % interval of each mean;
/// `series` names and colours the groups.
pub(crate) fn bars(
    title: &str,
    rows: &[BarRow],
    series: &[(String, RGBColor)],
) -> std::io::Result<String> {
    let k = series.len().max(1);
    let mut xmax: f64 = 0.0;
    for (_, groups) in rows {
        for v in groups.iter().flatten() {
            let s = inference::summarize(v);
            xmax = xmax.max(s.mean + half_width(v)).max(s.max);
        }
    }
    let xmax = if xmax > 0.0 { xmax * 1.1 } else { 1.0 };
    let n = rows.len();
    let h = 70 + (n * (k * 14 + 12)) as u32;
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    canvas(560, h, series, |area| {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(210)
            .build_cartesian_2d(0f64..xmax, -0.5f64..n as f64 - 0.5)
            .map_err(plot_err("chart"))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n.max(1))
            .y_label_formatter(&|y| row_label(*y, &names))
            .x_labels(5)
            .x_label_formatter(&|x| num(*x))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(plot_err("mesh"))?;
        // k bars in 0.8 of a row's slot, the first group on top.
        let w = 0.8 / k as f64;
        for (i, (_, groups)) in rows.iter().enumerate() {
            let y_mid = (n - 1 - i) as f64;
            for (g, v) in groups.iter().enumerate() {
                let Some(v) = v else { continue };
                let s = inference::summarize(v);
                let top = y_mid + 0.4 - g as f64 * w;
                let bottom = top - w * 0.85;
                let color = series.get(g).map_or(BLACK, |s| s.1);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0, bottom), (s.mean.max(0.0), top)],
                        color.filled(),
                    )))
                    .map_err(plot_err("bar"))?;
                let hw = half_width(v);
                if hw > 0.0 {
                    chart
                        .draw_series(std::iter::once(ErrorBar::new_horizontal(
                            (top + bottom) / 2.0,
                            (s.mean - hw).max(0.0),
                            s.mean,
                            s.mean + hw,
                            BLACK.stroke_width(1),
                            6,
                        )))
                        .map_err(plot_err("whisker"))?;
                }
            }
        }
        Ok(())
    })
}

/// The label of the row at `y` (rows top to bottom), empty between rows.
fn row_label(y: f64, names: &[String]) -> String {
    if (y - y.round()).abs() > 1e-6 || y.round() < 0.0 {
        return String::new();
    }
    let i = names.len() as i64 - 1 - y.round() as i64;
    usize::try_from(i)
        .ok()
        .and_then(|i| names.get(i).cloned())
        .unwrap_or_default()
}

/// One bar of a profile plot: a function, B − A, and its whisker.
pub(crate) struct DiffBar {
    pub(crate) name: String,
    pub(crate) diff: f64,
    pub(crate) spread: f64,
}

/// Horizontal bars of B − A from zero, the largest on top, whiskers
/// `spread` either side; B's colour where B executes more, A's where A
/// does.
pub(crate) fn diff_bars(
    title: &str,
    x_desc: &str,
    list: &[DiffBar],
    sides: [&str; 2],
) -> std::io::Result<String> {
    let lo = list
        .iter()
        .map(|e| e.diff - e.spread)
        .fold(0.0f64, f64::min);
    let hi = list
        .iter()
        .map(|e| e.diff + e.spread)
        .fold(0.0f64, f64::max);
    let pad = ((hi - lo) * 0.08).max(1.0);
    let n = list.len();
    let h = (80 + 24 * n as u32).max(200);
    let names: Vec<String> = list.iter().map(|e| e.name.clone()).collect();
    let items = [
        (format!("B − A > 0: {} executes more", sides[1]), B_COLOR),
        (format!("B − A < 0: {} executes more", sides[0]), A_COLOR),
    ];
    canvas(720, h, &items, |area| {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(40)
            .y_label_area_size(230)
            .build_cartesian_2d((lo - pad)..(hi + pad), -0.5f64..n as f64 - 0.5)
            .map_err(plot_err("chart"))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n.max(1))
            .y_label_formatter(&|y| row_label(*y, &names))
            .x_labels(6)
            .x_label_formatter(&|x| num(*x))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 13))
            .x_desc(x_desc)
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
            if e.spread > 0.0 {
                chart
                    .draw_series(std::iter::once(ErrorBar::new_horizontal(
                        y,
                        e.diff - e.spread,
                        e.diff,
                        e.diff + e.spread,
                        BLACK.stroke_width(1),
                        8,
                    )))
                    .map_err(plot_err("whisker"))?;
            }
        }
        Ok(())
    })
}

/// One curve of an overlay: its points, colour and legend.
pub(crate) type Curve = (Vec<(f64, f64)>, RGBColor, String);

/// Overlaid curves (x on a log scale when `log_x`), y from zero.
pub(crate) fn overlay(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    curves: &[Curve],
    log_x: bool,
) -> std::io::Result<Option<String>> {
    if curves.iter().all(|c| c.0.is_empty()) {
        return Ok(None);
    }
    let (mut xmin, mut xmax, mut ymax) = (f64::INFINITY, 0f64, 0f64);
    for (x, y) in curves.iter().flat_map(|c| c.0.iter()) {
        xmin = xmin.min(*x);
        xmax = xmax.max(*x);
        ymax = ymax.max(*y);
    }
    let ytop = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let items: Vec<(String, RGBColor)> = curves.iter().map(|c| (c.2.clone(), c.1)).collect();
    let svg = canvas(560, 340, &items, |area| {
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(title, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(42)
            .y_label_area_size(56);
        if log_x {
            let lo = (xmin * 0.8).max(1e-3);
            let hi = (xmax * 1.25).max(lo * 10.0);
            let chart = builder
                .build_cartesian_2d((lo..hi).log_scale(), 0f64..ytop)
                .map_err(plot_err("chart"))?;
            draw_curves(chart, x_desc, y_desc, curves)
        } else {
            let hi = if xmax > xmin { xmax + 1.0 } else { xmin + 2.0 };
            let chart = builder
                .build_cartesian_2d((xmin - 1.0).max(0.0)..hi, 0f64..ytop)
                .map_err(plot_err("chart"))?;
            draw_curves(chart, x_desc, y_desc, curves)
        }
    })?;
    Ok(Some(svg))
}

/// The mesh and every curve of an overlay, on either kind of x axis.
fn draw_curves<X>(
    mut chart: ChartContext<
        '_,
        SVGBackend<'_>,
        Cartesian2d<X, plotters::coord::types::RangedCoordf64>,
    >,
    x_desc: &str,
    y_desc: &str,
    curves: &[Curve],
) -> std::io::Result<()>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_labels(6)
        .x_label_formatter(&|x| num(*x))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 13))
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(plot_err("mesh"))?;
    for (pts, color, _) in curves {
        if pts.is_empty() {
            continue;
        }
        let color = *color;
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(plot_err("line"))?;
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(plot_err("points"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_width_uses_t() {
        assert_eq!(half_width(&[1.0]), 0.0);
        let hw = half_width(&[1.0, 2.0, 3.0]);
        // t(0.975, 2) = 4.303, sd = 1, n = 3.
        assert!((hw - 4.303 / 3f64.sqrt()).abs() < 1e-3, "{hw}");
    }

    #[test]
    fn bars_start_at_zero_with_the_legend_below_the_plot() {
        let a = vec![10.0, 11.0, 12.0];
        let b = vec![20.0, 21.0, 22.0];
        let rows: Vec<BarRow> = vec![("s/v".into(), vec![Some(&a), Some(&b)])];
        let series = [("A k1".to_string(), A_COLOR), ("B k2".to_string(), B_COLOR)];
        let svg = bars("IOPS", &rows, &series).unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let h: f64 = doc
            .root_element()
            .attribute("height")
            .unwrap()
            .parse()
            .unwrap();
        // The legend's labels sit in the strip under the plotting area.
        for label in ["A k1", "B k2"] {
            let t = doc
                .descendants()
                .find(|n| {
                    n.tag_name().name() == "text" && n.text().is_some_and(|t| t.trim() == label)
                })
                .unwrap_or_else(|| panic!("{label} in {svg}"));
            let y: f64 = t.attribute("y").unwrap().parse().unwrap();
            assert!(y >= h - f64::from(LEGEND_H), "{label} at y {y} of {h}");
        }
        // Both bars start at the same x: zero.
        let fill = |c: RGBColor| hex(c).to_uppercase();
        let x0: Vec<&str> = doc
            .descendants()
            .filter(|n| {
                n.tag_name().name() == "rect"
                    && [fill(A_COLOR), fill(B_COLOR)]
                        .contains(&n.attribute("fill").unwrap_or("").to_uppercase())
                    && n.attribute("y")
                        .is_some_and(|y| y.parse::<f64>().unwrap() < h - f64::from(LEGEND_H))
            })
            .map(|n| n.attribute("x").unwrap())
            .collect();
        assert_eq!(x0.len(), 2, "{svg}");
        assert_eq!(x0[0], x0[1], "{svg}");
    }
}
