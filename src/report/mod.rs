//! The A/B report (`blklab compare`, and the table `blklab run` prints).
//!
//! - [`stats`]: summaries, Welch and bootstrap intervals, significance;
//! - [`metrics`]: the metrics derived from each `blklab run` record;
//! - [`profile`]: the differential instruction profile (per function);
//! - [`load`]: reading run directories (and merging a run's shards) into
//!   the sides of a comparison;
//! - [`comparability`]: the conditions that change a number, and the one
//!   place that decides whether records may be pooled and compared
//!   (refusals, `--force`);
//! - [`compare`]: building the comparison's rows;
//! - [`render`]: terminal table, Markdown, CSV, JSON;
//! - [`verdict`]: what each row says, in words;
//! - [`html`]: the HTML page with SVG plots;
//! - [`screenshot`]: a PNG of the page, drawn by a headless Chromium.

pub(crate) mod comparability;
pub mod compare;
pub(crate) mod coverage;
pub(crate) mod html;
pub(crate) mod inference;
pub mod load;
pub(crate) mod profile;
pub(crate) mod render;
pub mod screenshot;
pub(crate) mod verdict;

use std::path::{Path, PathBuf};

/// Write every format of `report` into `dir`: report.txt, report.md,
/// report.csv, report.json, report.html and plots/. Returns the files.
pub(crate) fn write_all(
    report: &compare::Report,
    a: &load::Side,
    b: &load::Side,
    dir: &Path,
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut files = Vec::new();
    for (name, text) in [
        ("report.txt", render::table(report)),
        ("report.md", render::markdown(report)),
        ("report.csv", render::csv(report)),
        ("report.json", render::json(report)),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text)?;
        files.push(p);
    }
    files.extend(html::write(report, a, b, dir)?);
    Ok(files)
}

/// The comparisons `blklab run` makes at its end: its first kernel (A)
/// against each other kernel (B), from the run directory it wrote.
pub(crate) fn run_comparisons(
    out_dir: &Path,
    metrics: &[String],
) -> Result<Vec<(compare::Report, load::Side, load::Side)>, compare::ReportError> {
    let (run, records) = load::load_dir(out_dir)?;
    let kernels = load::kernels(&run, &records);
    let opts = compare::Options {
        confidence: 0.95,
        force: false,
        profile_top: profile::DEFAULT_TOP,
    };
    let mut out = Vec::new();
    for k in kernels.iter().skip(1) {
        let filter = load::RunFilter::default();
        let a = load::load_side(&format!("{}:{}", out_dir.display(), kernels[0]), filter)?;
        let b = load::load_side(&format!("{}:{k}", out_dir.display()), filter)?;
        let subject = compare::Subject {
            a: &a,
            b: &b,
            pairs: &[],
        };
        let r = compare::build::<compare::KernelRows>(&subject, metrics, &opts)?;
        out.push((r, a, b));
    }
    Ok(out)
}
