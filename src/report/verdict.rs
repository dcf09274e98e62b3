//! The report's verdict: what each row says, in words. Which metrics
//! changed significantly, by how much and with what interval, or that the
//! row is noise (or has too few samples to call); and, where the records
//! tell, why: the mechanism counts per IO that moved in every run and where
//! the instructions went (the differential profile's groups and functions
//! whose runs do not overlap).

use serde::Serialize;

use crate::record::metrics::{self, Better};
use crate::report::compare::{Mode, Report, Row};
use crate::report::inference::{Comparison, Summary, MIN_SAMPLES_FOR_SIGNIFICANCE};
use crate::report::profile::{Entry, RowProfile};
use crate::util::text::num;

/// What a row says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Call {
    /// At least one metric shown changed significantly (after Holm).
    Significant,
    /// Enough samples, and no metric shown changed beyond its noise.
    Noise,
    /// Fewer than 3 samples a side: nothing can be called.
    TooFew,
    /// The sides are the run's A/A pair, one kernel under two labels:
    /// their deltas are the run's noise floor, not findings.
    Aa,
    /// Some metric shown changed significantly, but none beyond the run's
    /// A/A floor: no effect.
    WithinAaFloor,
}

impl Call {
    /// The call as a reader sees it (with the table's mark).
    pub(crate) fn text(self) -> &'static str {
        match self {
            Call::Significant => "* significant",
            Call::Noise => "~ noise",
            Call::TooFew => "n<3 too few samples",
            Call::Aa => "A/A",
            Call::WithinAaFloor => "within the A/A floor",
        }
    }
}

/// One significant change of a row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Change {
    pub(crate) metric: String,
    /// Which effect: `B vs A`; with two kernels and pairs, the pair's
    /// effect on `A` or `B`, or `DiD`.
    pub(crate) effect: String,
    /// The means of the two groups compared (none for a DiD).
    pub(crate) a_mean: Option<f64>,
    pub(crate) b_mean: Option<f64>,
    pub(crate) delta_pct: f64,
    pub(crate) ci_lo_pct: Option<f64>,
    pub(crate) ci_hi_pct: Option<f64>,
    /// The change is for the worse, in the metric's better direction.
    pub(crate) worse: bool,
}

/// One row's verdict.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RowVerdict {
    pub(crate) row: String,
    pub(crate) call: Call,
    /// The significant changes, in the report's metric order (none in a
    /// comparison of the run's A/A pair itself).
    pub(crate) changes: Vec<Change>,
    /// The significant changes within the run's A/A floor, which the
    /// verdict does not call effects.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) within_aa_floor: Vec<Change>,
    /// What moved beneath the metrics in every run: mechanism counts per IO,
    /// then the instruction profile's groups and functions.
    pub(crate) mechanism: Vec<String>,
    /// The verdict in words.
    pub(crate) words: String,
}

/// Counts per IO that say how a request travels; a change of at least
/// [`MIN_COUNT_CHANGE`] per IO whose runs do not overlap is part of a
/// row's mechanism.
const COUNT_METRICS: &[&str] = &[
    "ctxsw_per_io",
    "kblockd_runs_per_io",
    "flush_plug_per_io",
    "idle_entries_per_io",
    "irqs_per_io",
    "kicks_per_io",
    "notifications_per_io",
    "kvm_exits_per_io",
    "world_switches_per_io",
];
const MIN_COUNT_CHANGE: f64 = 0.1;

/// Groups and functions named in a mechanism.
const TOP_GROUPS: usize = 3;
const TOP_FUNCTIONS: usize = 3;

/// Every row's verdict.
pub(crate) fn judge(report: &Report) -> Vec<RowVerdict> {
    report.rows.iter().map(|r| row_verdict(report, r)).collect()
}

/// What A and B are in a row's words.
fn sides(report: &Report, row: &Row) -> (String, String) {
    match (&report.mode, &row.pair) {
        (Mode::Kernels, _) | (_, None) => (report.a.kernel.clone(), report.b.kernel.clone()),
        (_, Some(p)) => (p.base.clone(), p.other.clone()),
    }
}

fn row_verdict(report: &Report, row: &Row) -> RowVerdict {
    let shown: Vec<(&str, &Comparison, String)> = shown_effects(report, row);
    let (changes, within_aa_floor) = significant_changes(report, row, &shown);
    let enough = shown.iter().any(|(_, c, _)| {
        c.a.n >= MIN_SAMPLES_FOR_SIGNIFICANCE && c.b.n >= MIN_SAMPLES_FOR_SIGNIFICANCE
    }) || row
        .did
        .values()
        .any(|d| d.did.n.iter().all(|&n| n >= MIN_SAMPLES_FOR_SIGNIFICANCE));
    let call = call_of(report, &changes, &within_aa_floor, enough);
    let (changes, within_aa_floor) = if call == Call::Aa {
        (Vec::new(), Vec::new())
    } else {
        (changes, within_aa_floor)
    };
    let (a, b) = sides(report, row);
    // One profile per row; with two kernels and pairs, one per kernel.
    let profiles: Vec<&RowProfile> = report
        .profiles
        .iter()
        .filter(|p| p.scenario == row.scenario && p.variant == row.variant && p.pair == row.pair)
        .collect();
    let mut mechanism = count_changes(row, &a, &b);
    for p in &profiles {
        let on = p.kernel.as_ref().map(|k| format!("on {k}, "));
        mechanism.extend(
            profile_changes(p)
                .into_iter()
                .map(|m| format!("{}{m}", on.as_deref().unwrap_or(""))),
        );
    }
    let profile = profiles.first().copied().filter(|p| p.kernel.is_none());
    let found = Found {
        changes: &changes,
        within_aa_floor: &within_aa_floor,
        shown: &shown,
        mechanism: &mechanism,
    };
    let words = words(report, row, call, &found, profile);
    RowVerdict {
        row: row.name(),
        call,
        changes,
        within_aa_floor,
        mechanism,
        words,
    }
}

/// A row's significant changes: those beyond the run's A/A floor (every
/// one without a floor, and the differences in differences), and those
/// within it.
fn significant_changes(
    report: &Report,
    row: &Row,
    shown: &[(&str, &Comparison, String)],
) -> (Vec<Change>, Vec<Change>) {
    let (within, beyond): (Vec<_>, Vec<_>) = shown
        .iter()
        .filter(|(_, c, _)| c.outcome.significant)
        .partition(|(k, _, _)| report.within_floor(row, k).is_some());
    let as_changes = |v: Vec<&(&str, &Comparison, String)>| -> Vec<Change> {
        v.into_iter().map(|(k, c, e)| change(k, c, e)).collect()
    };
    let mut beyond = as_changes(beyond);
    beyond.extend(did_changes(report, row));
    (beyond, as_changes(within))
}

/// A row's call: `A/A` for the run's A/A pair itself (with enough
/// samples), significant with a change beyond the A/A floor, within the
/// floor when every significant change is, else noise or too few samples.
fn call_of(report: &Report, changes: &[Change], within: &[Change], enough: bool) -> Call {
    if !enough && changes.is_empty() {
        Call::TooFew
    } else if report.is_aa() {
        Call::Aa
    } else if !changes.is_empty() {
        Call::Significant
    } else if !within.is_empty() {
        Call::WithinAaFloor
    } else {
        Call::Noise
    }
}

/// What a row's verdict found, for its words.
struct Found<'a, 'r> {
    changes: &'a [Change],
    within_aa_floor: &'a [Change],
    shown: &'a [(&'r str, &'r Comparison, String)],
    mechanism: &'a [String],
}

/// The comparisons of the metrics shown, with the effect each is of.
fn shown_effects<'a>(report: &'a Report, row: &'a Row) -> Vec<(&'a str, &'a Comparison, String)> {
    let mut out = Vec::new();
    for k in &report.metrics {
        if let Some(c) = row.metrics.get(k) {
            out.push((k.as_str(), c, "B vs A".to_string()));
        }
        if let Some(d) = row.did.get(k) {
            out.push((k.as_str(), &d.a, format!("pair on {}", report.a.kernel)));
            out.push((k.as_str(), &d.b, format!("pair on {}", report.b.kernel)));
        }
    }
    out
}

/// The significant differences in differences of a row's shown metrics.
fn did_changes(report: &Report, row: &Row) -> Vec<Change> {
    report
        .metrics
        .iter()
        .filter_map(|k| {
            let d = row.did.get(k)?;
            d.did.outcome.significant.then(|| Change {
                metric: k.clone(),
                effect: "DiD".into(),
                a_mean: None,
                b_mean: None,
                delta_pct: d.did.delta_pct,
                ci_lo_pct: d.did.ci_pct.map(|i| i.lo),
                ci_hi_pct: d.did.ci_pct.map(|i| i.hi),
                worse: worse(k, d.did.delta_pct),
            })
        })
        .collect()
}

/// Is a change of `delta` in metric `key` for the worse?
fn worse(key: &str, delta: f64) -> bool {
    match metrics::find(key).map(|m| m.better) {
        Some(Better::Higher) => delta < 0.0,
        _ => delta > 0.0,
    }
}

fn change(key: &str, c: &Comparison, effect: &str) -> Change {
    Change {
        metric: key.to_string(),
        effect: effect.to_string(),
        a_mean: Some(c.a.mean),
        b_mean: Some(c.b.mean),
        delta_pct: c.delta_pct,
        ci_lo_pct: c.ci_pct.map(|i| i.lo),
        ci_hi_pct: c.ci_pct.map(|i| i.hi),
        worse: worse(key, c.delta_pct),
    }
}

/// The metric's title, e.g. `guest kernel instructions per IO`.
fn title(key: &str) -> String {
    metrics::find(key).map_or(key.to_string(), |m| m.title.to_string())
}

/// Do the runs of the two sides not overlap?
fn apart(a: &Summary, b: &Summary) -> bool {
    a.n >= 2 && b.n >= 2 && (a.max < b.min || b.max < a.min)
}

/// A difference is clear when the runs do not overlap and it is at least
/// [`CLEAR_SDS`] times either side's sd: with 3 runs a side, runs that
/// merely do not overlap happen by chance one time in ten.
const CLEAR_SDS: f64 = 4.0;

fn clear(diff: f64, sd_a: f64, sd_b: f64) -> bool {
    diff.abs() >= CLEAR_SDS * sd_a.max(sd_b)
}

/// A profile line whose sides differ clearly, and not in a function that
/// is a measurement artefact (an emulated clock, an allocator slow path, a
/// vCPU spinning on a lock).
fn clear_entry(e: &Entry) -> bool {
    e.separated
        && clear(e.diff, e.a.sd, e.b.sd)
        && crate::report::profile::artefact(&e.name).is_none()
}

/// The mechanism counts per IO that moved in every run, each with what
/// it means where the change is one blklab knows.
fn count_changes(row: &Row, a: &str, b: &str) -> Vec<String> {
    let mut out = Vec::new();
    for key in COUNT_METRICS {
        let Some(c) = row.metrics.get(*key) else {
            continue;
        };
        let diff = c.b.mean - c.a.mean;
        if !apart(&c.a, &c.b) || !clear(diff, c.a.sd, c.b.sd) || diff.abs() < MIN_COUNT_CHANGE {
            continue;
        }
        let mut s = format!("{} {} → {}", title(key), num(c.a.mean), num(c.b.mean));
        let (more, less) = if c.b.mean > c.a.mean { (b, a) } else { (a, b) };
        let (hi, lo) = (c.a.mean.max(c.b.mean), c.a.mean.min(c.b.mean));
        match *key {
            "kblockd_runs_per_io" if hi >= 0.5 && lo < 0.1 => s.push_str(&format!(
                ": {more} runs the hardware queue from the kblockd workqueue about once per IO, \
                 so a kworker dispatches each request, a context switch away from the task \
                 that submitted it"
            )),
            "flush_plug_per_io" if hi >= 0.9 && lo < 0.1 => s.push_str(&format!(
                ": {less} flushes no plug, it issues each request directly (no per-bio plug)"
            )),
            _ => {}
        }
        out.push(s);
    }
    out
}

/// The groups of the functions a profile warns about: a group holding a
/// measurement artefact says more about the measurement than the kernel.
fn tainted_groups(p: &RowProfile) -> Vec<&'static str> {
    p.warnings
        .iter()
        .map(|w| crate::record::symbol_groups::group_of(&w.function))
        .collect()
}

/// `name +12.3` for a profile entry.
fn signed(e: &Entry) -> String {
    format!("{} {:+.0}", e.name, e.diff)
}

/// Where the instructions went: the groups and functions whose runs do
/// not overlap, largest |B − A| first.
fn profile_changes(p: &RowProfile) -> Vec<String> {
    let mut out = Vec::new();
    let kernel_a = p.totals.first().map(|e| e.a.mean.abs()).unwrap_or(0.0);
    // A group matters from 1 % of A's kernel instructions per IO on.
    let floor = (kernel_a * 0.01).max(1.0);
    let tainted = tainted_groups(p);
    let mut groups: Vec<&Entry> = p
        .groups
        .iter()
        .filter(|e| clear_entry(e) && e.diff.abs() >= floor && !tainted.contains(&e.name.as_str()))
        .collect();
    groups.sort_by(|x, y| y.diff.abs().total_cmp(&x.diff.abs()));
    if !groups.is_empty() {
        let list: Vec<String> = groups.iter().take(TOP_GROUPS).map(|e| signed(e)).collect();
        out.push(format!(
            "kernel instructions per IO by group: {}",
            list.join(", ")
        ));
    }
    let functions: Vec<String> = p
        .functions
        .iter()
        .filter(|e| clear_entry(e))
        .take(TOP_FUNCTIONS)
        .map(signed)
        .collect();
    if !functions.is_empty() {
        out.push(format!("by function: {}", functions.join(", ")));
    }
    out
}

/// `title +1.2 % (A → B; 95 % CI lo to hi %)`.
fn change_text(c: &Change, confidence: f64) -> String {
    let ci = match (c.ci_lo_pct, c.ci_hi_pct) {
        (Some(lo), Some(hi)) => format!("{:.0} % CI {lo:+.1} to {hi:+.1} %", confidence * 100.0),
        _ => "no interval".into(),
    };
    let means = match (c.a_mean, c.b_mean) {
        (Some(a), Some(b)) => format!("{} → {}; ", num(a), num(b)),
        _ => String::new(),
    };
    let effect = if c.effect == "B vs A" {
        String::new()
    } else {
        format!("{} ", c.effect)
    };
    format!(
        "{effect}{} {:+.1} % ({means}{ci}, {})",
        title(&c.metric),
        c.delta_pct,
        if c.worse { "worse" } else { "better" }
    )
}

/// The verdict of a row in words.
fn words(
    report: &Report,
    row: &Row,
    call: Call,
    found: &Found,
    profile: Option<&RowProfile>,
) -> String {
    let (a, b) = sides(report, row);
    let conf = report.confidence;
    let list = |changes: &[Change]| -> String {
        let v: Vec<String> = changes.iter().map(|c| change_text(c, conf)).collect();
        v.join("; ")
    };
    let mut out = match call {
        Call::Significant => format!("{b} against {a}: {}.", list(found.changes)),
        Call::Noise => format!(
            "No metric shown changes significantly: none survives Holm's correction over the \
             report's {} comparisons{}.",
            family_size(report),
            largest(report, row, found.shown)
        ),
        Call::TooFew => format!(
            "Too few samples to call (fewer than {MIN_SAMPLES_FOR_SIGNIFICANCE} runs a side){}.",
            largest(report, row, found.shown)
        ),
        Call::Aa => aa_words(report, row, found.shown),
        Call::WithinAaFloor => format!(
            "No metric shown changes beyond this run's A/A floor: {b} against {a}: {}.",
            floor_list(report, row, found.within_aa_floor)
        ),
    };
    if call == Call::Significant && !found.within_aa_floor.is_empty() {
        out.push_str(&format!(
            " Significant but not beyond this run's A/A floor, so no effect: {}.",
            floor_list(report, row, found.within_aa_floor)
        ));
    }
    if !found.mechanism.is_empty() {
        out.push_str(&format!(
            " In every run ({a} → {b}): {}.",
            found.mechanism.join("; ")
        ));
    }
    if !matches!(call, Call::Significant | Call::Aa) {
        if let Some(note) = below_noise(row, profile) {
            out.push_str(&format!(" {note}"));
        }
    }
    out
}

/// The words of a row of the run's A/A pair compared with itself: what
/// its deltas are, the largest, and how many passed Holm's correction
/// (which an A/A report does by chance, at most 1 − confidence of the
/// time).
fn aa_words(report: &Report, row: &Row, shown: &[(&str, &Comparison, String)]) -> String {
    let same = report
        .aa_pair
        .as_ref()
        .map_or(String::new(), |p| format!(" ({})", p.same_kernel));
    let lucky = shown
        .iter()
        .filter(|(_, c, _)| c.outcome.significant)
        .count();
    let lucky = if lucky == 0 {
        String::new()
    } else {
        format!(
            " {lucky} metric(s) pass Holm's correction here, which two labels of one kernel \
             do by chance (at most {:.0} % of A/A reports).",
            (1.0 - report.confidence) * 100.0
        )
    };
    format!(
        "A/A: both sides are one kernel{same}, so its deltas are this run's noise floor, \
         not findings{}.{lucky}",
        largest(report, row, shown)
    )
}

/// Changes within the A/A floor, each with the floor it is within.
fn floor_list(report: &Report, row: &Row, changes: &[Change]) -> String {
    let v: Vec<String> = changes
        .iter()
        .map(|c| {
            let floor = report
                .within_floor(row, &c.metric)
                .map_or(String::new(), |f| {
                    format!(", within the A/A floor of {:+.1} %", f.diff_pct)
                });
            format!("{}{floor}", change_text(c, report.confidence))
        })
        .collect();
    v.join("; ")
}

/// How many comparisons the report's Holm correction covers.
fn family_size(report: &Report) -> usize {
    report
        .rows
        .iter()
        .map(|r| {
            report
                .metrics
                .iter()
                .map(|k| {
                    usize::from(r.metrics.contains_key(k)) + 3 * usize::from(r.did.contains_key(k))
                })
                .sum::<usize>()
        })
        .sum()
}

/// `; the largest delta: …` over the shown comparisons, with its A/A
/// floor when the row has one.
fn largest(report: &Report, row: &Row, shown: &[(&str, &Comparison, String)]) -> String {
    let Some((k, c, effect)) = shown
        .iter()
        .filter(|(_, c, _)| c.delta_pct.is_finite())
        .max_by(|x, y| x.1.delta_pct.abs().total_cmp(&y.1.delta_pct.abs()))
    else {
        return String::new();
    };
    let cv = c.a.cv_pct.max(c.b.cv_pct);
    let floor = row.aa_floor.get(*k).map_or(String::new(), |f| {
        let within = if f.within { ", within it" } else { "" };
        format!("; A/A floor {:+.1} %{within}", f.diff_pct)
    });
    format!(
        "; the largest delta: {} (cv up to {cv:.1} %{floor})",
        change_text(&change(k, c, effect), report.confidence)
    )
}

/// Where a row with no significant metric still has clear differences in
/// its profile: how large they are against the totals' spread.
fn below_noise(row: &Row, profile: Option<&RowProfile>) -> Option<String> {
    let p = profile?;
    let tainted = tainted_groups(p);
    let exact: f64 = p
        .groups
        .iter()
        .filter(|e| clear_entry(e) && !tainted.contains(&e.name.as_str()))
        .map(|e| e.diff)
        .sum();
    if exact == 0.0 {
        return None;
    }
    let kernel = row.metrics.get("kernel_instructions_per_io")?;
    let share = exact / kernel.a.mean.abs() * 100.0;
    let cv = kernel.a.cv_pct.max(kernel.b.cv_pct);
    Some(format!(
        "The profile still tells the sides apart: its groups that differ clearly differ by \
         {exact:+.0} kernel instructions per IO ({share:+.1} % of A's), against a run-to-run \
         spread of the kernel's total of cv {cv:.1} %."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::inference;

    #[test]
    fn a_change_reads_with_direction_and_interval() {
        let c = inference::compare(&[100.0, 101.0, 99.0], &[150.0, 151.0, 149.0], 0.95);
        let ch = change("kernel_instructions_per_io", &c, "B vs A");
        assert!(ch.worse);
        let t = change_text(&ch, 0.95);
        assert!(
            t.starts_with("guest kernel instructions per IO +50.0 % (100.0 → 150.0; 95 % CI +"),
            "{t}"
        );
        assert!(t.ends_with(", worse)"), "{t}");
        let iops = change("iops", &c, "B vs A");
        assert!(!iops.worse, "more IOPS is better");
    }

    #[test]
    fn a_clear_difference_is_apart_by_several_sds_and_no_artefact() {
        assert!(clear(1.0, 0.0, 0.0));
        assert!(clear(-4.0, 1.0, 0.5));
        assert!(!clear(3.9, 1.0, 0.5));
        let side = |mean: f64, sd: f64| crate::report::profile::SideValue {
            mean,
            sd,
            n: 3,
            min: mean - sd,
            max: mean + sd,
        };
        let entry = |name: &str, a: f64, b: f64, sd: f64| Entry {
            name: name.into(),
            group: "g".into(),
            a: side(a, sd),
            b: side(b, sd),
            diff: b - a,
            separated: true,
        };
        assert!(clear_entry(&entry("__schedule", 10.0, 250.0, 5.0)));
        assert!(
            !clear_entry(&entry("__schedule", 10.0, 30.0, 6.0)),
            "too near"
        );
        assert!(
            !clear_entry(&entry("queued_spin_lock_slowpath", 10.0, 900.0, 5.0)),
            "an artefact"
        );
    }

    #[test]
    fn runs_apart_need_two_samples_a_side_and_no_overlap() {
        let s = |v: &[f64]| inference::summarize(v);
        assert!(apart(&s(&[1.0, 1.1]), &s(&[2.0, 2.1])));
        assert!(!apart(&s(&[1.0, 2.05]), &s(&[2.0, 2.1])));
        assert!(!apart(&s(&[1.0]), &s(&[2.0, 2.1])));
    }
}
