//! The page's section per row: what it measures, its verdict, its
//! differential profile(s) and its distributions (fio's completion
//! latency as a CDF, requests per kick), each group's curve overlaid.

use std::collections::BTreeMap;

use maud::{html, Markup};

use super::plots::{self, Curve};
use super::{file_safe, groups_style, profile, row_id, Page};
use crate::report::compare::{Report, Row};
use crate::report::load::Side;
use crate::report::verdict::RowVerdict;

/// A group's points in one plot, from its side's records of its
/// (scenario, variant).
type GroupPoints = fn(&Side, &str, &str) -> Vec<(f64, f64)>;

/// Each row: what it measures, its verdict, its profile(s) and its
/// distributions.
pub(super) fn section(
    page: &mut Page,
    report: &Report,
    verdicts: &[RowVerdict],
    sides: [&Side; 2],
) -> std::io::Result<Markup> {
    page.section("rows", "Scenarios", |page| {
        let mut subs = Vec::new();
        for (r, v) in report.rows.iter().zip(verdicts) {
            let mut profiles = Vec::new();
            for p in report
                .profiles
                .iter()
                .filter(|p| p.scenario == r.scenario && p.variant == r.variant && p.pair == r.pair)
            {
                profiles.push(profile::profile(page, p)?);
            }
            let figures = distributions(page, report, r, sides)?;
            let body = html! {
                p { (r.about) }
                p { strong { (v.call.text()) } ": " (v.words) }
                @for p in profiles { (p) }
                @if !figures.is_empty() {
                    h4 { "Distributions" }
                    div.pair { @for f in figures { (f) } }
                }
            };
            subs.push(page.sub(&row_id(r), &r.name(), body));
        }
        Ok(html! { @for s in subs { (s) } })
    })
}

/// A row's distribution plots: fio's completion latency (latency on x,
/// percentile on y: the curve reads as a CDF) and requests per kick, each
/// when some group has data.
fn distributions(
    page: &mut Page,
    report: &Report,
    r: &Row,
    sides: [&Side; 2],
) -> std::io::Result<Vec<Markup>> {
    let style = groups_style(report);
    let name = r.name();
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
    let mut figures = Vec::new();
    let lat = curves(|s, sc, v| swap(&latency_curve(s, sc, v)));
    if let Some(svg) = plots::overlay(
        &format!("{name}: fio completion latency"),
        "latency (µs)",
        "percentile",
        &lat,
        true,
    )? {
        figures.push(page.figure(&format!("latency-{base}.svg"), &svg, "latency")?);
    }
    if let Some(svg) = plots::overlay(
        &format!("{name}: requests per kick"),
        "requests per kick",
        "share of kicks",
        &curves(kick_distribution),
        false,
    )? {
        figures.push(page.figure(
            &format!("requests-per-kick-{base}.svg"),
            &svg,
            "requests per kick",
        )?);
    }
    Ok(figures)
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
fn swap(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points.iter().map(|(p, l)| (*l, *p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_points() {
        assert_eq!(swap(&[(50.0, 120.0)]), vec![(120.0, 50.0)]);
    }
}
