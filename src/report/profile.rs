//! The differential instruction profile of an A/B comparison: for each
//! scenario row whose records carry `instructions` (`blklab run
//! --count-insns`), the guest kernel's instructions per IO by symbol group
//! and by function on each side (mean and sd over the iterations), and the
//! functions ranked by |mean(B) − mean(A)|. "The plug path costs 150
//! instructions per IO, and here is where" in one table. Rows of nested
//! runs whose records on both sides carry the host's profile
//! (`host_instructions`) get the same for the host (its kernel's functions
//! from `/proc/kallsyms`, its groups by `symbol_groups::host_group_of`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::record::host_cost::{self, ModelledHostCost};
use crate::record::instructions::{HostInstructions, Instructions};
use crate::record::result::ResultRecord;
use crate::report::inference;

/// Functions shown per row unless asked otherwise.
pub(crate) const DEFAULT_TOP: usize = 15;

/// One side's samples of one quantity, summarised.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SideValue {
    pub(crate) mean: f64,
    pub(crate) sd: f64,
    pub(crate) n: usize,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

fn side_value(v: &[f64]) -> SideValue {
    let s = inference::summarize(v);
    SideValue {
        mean: s.mean,
        sd: if s.n < 2 { 0.0 } else { s.sd },
        n: s.n,
        min: s.min,
        max: s.max,
    }
}

/// One line of a profile: a function or a group.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Entry {
    pub(crate) name: String,
    /// The function's symbol group (for functions); the group itself for groups.
    pub(crate) group: String,
    pub(crate) a: SideValue,
    pub(crate) b: SideValue,
    /// mean(B) − mean(A), instructions per IO.
    pub(crate) diff: f64,
    /// Every run of one side lies beyond every run of the other: a
    /// difference the runs' scatter cannot explain.
    pub(crate) separated: bool,
}

/// Do the two sides' ranges not overlap (with a difference)?
fn separated(a: &SideValue, b: &SideValue) -> bool {
    a.n > 0 && b.n > 0 && (a.max < b.min || b.max < a.min)
}

impl Entry {
    /// The entry `name` of `group` from each side's values.
    fn of(name: String, group: String, va: &[f64], vb: &[f64]) -> Entry {
        let (a, b) = (side_value(va), side_value(vb));
        Entry {
            name,
            group,
            diff: b.mean - a.mean,
            separated: separated(&a, &b),
            a,
            b,
        }
    }
}

/// The two variants of one row of a pair comparison, as `SCENARIO/VARIANT`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RowPair {
    pub(crate) base: String,
    pub(crate) other: String,
}

impl RowPair {
    /// The pair of a base and an other (scenario, variant).
    pub(crate) fn of((bs, bv): &(String, String), (os, ov): &(String, String)) -> RowPair {
        RowPair {
            base: format!("{bs}/{bv}"),
            other: format!("{os}/{ov}"),
        }
    }

    /// `SCENARIO/BASE → OTHER` (the other's scenario too when it differs).
    pub(crate) fn name(&self) -> String {
        let (bs, _) = self.base.rsplit_once('/').unwrap_or(("", &self.base));
        let other = match self.other.rsplit_once('/') {
            Some((os, ov)) if os == bs => ov.to_string(),
            _ => self.other.clone(),
        };
        format!("{} → {other}", self.base)
    }
}

/// The profile of one (scenario, variant) row, or of a variant pair (on
/// one kernel).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RowProfile {
    pub(crate) scenario: String,
    pub(crate) variant: String,
    /// Variant pairs: A is the base variant, B the other.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pair: Option<RowPair>,
    /// Variant pairs on two kernels: the kernel this profile is of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kernel: Option<String>,
    /// What A and B are, for the column headers.
    #[serde(skip)]
    pub(crate) a_label: String,
    #[serde(skip)]
    pub(crate) b_label: String,
    /// kernel, user, total instructions per IO, idle entries and context
    /// switches per IO: the quantities that explain the totals' scatter.
    pub(crate) totals: Vec<Entry>,
    /// Every group, largest |diff| first.
    pub(crate) groups: Vec<Entry>,
    /// The `top` functions: separated differences first, each by |diff|.
    pub(crate) functions: Vec<Entry>,
    /// Functions with a difference that were left out of `functions`.
    pub(crate) more_functions: usize,
    /// Sum of every function's diff (= the kernel's per-IO difference as far
    /// as blocks were attributed).
    pub(crate) functions_diff_sum: f64,
    /// Measurement artefacts at the top of either side's profile (see
    /// [`artefacts`]); empty for a clean profile.
    pub(crate) warnings: Vec<ArtefactWarning>,
    /// Nested runs: the host's profile, when both sides have one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) host: Option<HostProfile>,
    /// The modelled host cost per IO (`record::host_cost`: not measured),
    /// term by term, when both sides count would-be exits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) modelled: Vec<Entry>,
}

/// The host side of a nested row's profile: the host's instructions per IO
/// (kernel, user, all, world switches), its kernel's by host group and by
/// function, B − A.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HostProfile {
    pub(crate) totals: Vec<Entry>,
    /// Every host group, largest |diff| first.
    pub(crate) groups: Vec<Entry>,
    /// The `top` functions, ranked as the guest's.
    pub(crate) functions: Vec<Entry>,
    /// Functions with a difference that were left out of `functions`.
    pub(crate) more_functions: usize,
    /// Sum of every host function's diff.
    pub(crate) functions_diff_sum: f64,
}

/// A function near the top of one side's profile that says more about how
/// the guest was measured than about the block layer: an emulated clock, an
/// allocator on its slow path, a vCPU spinning on a lock.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ArtefactWarning {
    /// "a" or "b".
    pub(crate) side: &'static str,
    pub(crate) function: String,
    /// "clock read", "allocator slow path" or "lock spinning".
    pub(crate) kind: &'static str,
    /// Its rank on that side by instructions per IO (1 = the most).
    pub(crate) rank: usize,
    /// Mean instructions per IO on that side.
    pub(crate) per_io: f64,
    /// Its share of that side's kernel instructions per IO, in percent.
    pub(crate) kernel_share_pct: f64,
    /// What it suggests, and what to check.
    pub(crate) hint: &'static str,
}

/// A function counts as "top" when it is among the first [`ARTEFACT_RANK`]
/// of a side by instructions per IO and at least [`ARTEFACT_MIN_PCT`] % of
/// its kernel instructions, or whatever its rank at [`ARTEFACT_PCT`] % or
/// more. (In clean 6.12 profiles the largest function is about 3 %, and
/// every function below is under 1 %.)
const ARTEFACT_RANK: usize = 5;
const ARTEFACT_MIN_PCT: f64 = 1.0;
const ARTEFACT_PCT: f64 = 5.0;

/// The kind of artefact a kernel function is and what it suggests, if it is
/// one. Compiler suffixes (`.constprop.0`, `.isra.0`, `.part.0`) are
/// ignored. Paravirtual clock reads (kvm-clock's `pvclock_clocksource_read`)
/// and `read_tsc` are not listed: they read memory and the TSC, a real cost
/// a guest pays, not an emulated device.
pub(crate) fn artefact(function: &str) -> Option<(&'static str, &'static str)> {
    let f = function.split('.').next().unwrap_or(function);
    const CLOCK: &str = "clock read";
    const ALLOC: &str = "allocator slow path";
    const LOCK: &str = "lock spinning";
    let hit = match f {
        "read_hpet" => (
            CLOCK,
            "the clocksource is the HPET? every clock read is an emulated MMIO read; \
             check the kernel's clocksource (boot console 'Switched to clocksource', \
             /sys/devices/system/clocksource/clocksource0/current_clocksource; \
             under TCG blklab boots with clocksource=tsc tsc=reliable unless --append overrides it; records say the guest's clocksource)",
        ),
        "acpi_pm_read" | "acpi_pm_read_verified" | "acpi_pm_read_slow" => (
            CLOCK,
            "the clocksource is the ACPI PM timer? every clock read is an emulated port read; \
             check the kernel's clocksource (boot console 'Switched to clocksource'; \
             under TCG blklab boots with clocksource=tsc tsc=reliable unless --append overrides it; records say the guest's clocksource)",
        ),
        "i8253_read" | "pit_read" => (
            CLOCK,
            "the clocksource is the PIT? every clock read is emulated port IO; \
             check the kernel's clocksource (boot console 'Switched to clocksource')",
        ),
        "___slab_alloc" | "__slab_alloc" | "cache_alloc_refill" => (
            ALLOC,
            "the slab allocator keeps taking its slow path: no per-CPU caches? \
             check the kernel's config (SLUB_TINY, SLUB_CPU_PARTIAL, SLAB)",
        ),
        "get_page_from_freelist" | "rmqueue_bulk" => (
            ALLOC,
            "the page allocator is this busy per IO: slabs refilled from pages (SLOB, \
             SLUB_TINY?) or memory pressure; check the kernel's config and the guest's memory",
        ),
        "native_queued_spin_lock_slowpath"
        | "__pv_queued_spin_lock_slowpath"
        | "queued_spin_lock_slowpath"
        | "queued_read_lock_slowpath"
        | "queued_write_lock_slowpath" => (
            LOCK,
            "vCPUs spin on a contended lock: under TCG a waiting vCPU burns instructions \
             until the holder's vCPU thread runs again (more so on a loaded host), so the \
             count measures the host's scheduling as much as the kernel; compare the \
             functions below it, or measure under KVM",
        ),
        _ if f.starts_with("slob_") => (
            ALLOC,
            "the kernel uses the SLOB allocator (tinyconfig before 6.4 picks it): one global \
             free list walked under a lock; build with CONFIG_SLUB=y (images/kernel/guest.config)",
        ),
        _ => return None,
    };
    Some(hit)
}

/// The artefacts at the top of each side's profile: per side, the
/// functions ranked by mean instructions per IO, their share of the side's
/// kernel instructions per IO (the sum of its functions when the records
/// have no kernel total).
fn artefacts(all: &[Entry], kernel: (Option<f64>, Option<f64>)) -> Vec<ArtefactWarning> {
    let mut out = Vec::new();
    for side in ["a", "b"] {
        let pick = |e: &Entry| if side == "a" { e.a.mean } else { e.b.mean };
        let mut ranked: Vec<(&Entry, f64)> = all
            .iter()
            .map(|e| (e, pick(e)))
            .filter(|(_, v)| v.is_finite() && *v > 0.0)
            .collect();
        ranked.sort_by(|x, y| {
            y.1.partial_cmp(&x.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(x.0.name.cmp(&y.0.name))
        });
        let total = match if side == "a" { kernel.0 } else { kernel.1 } {
            Some(k) if k > 0.0 => k,
            _ => ranked.iter().map(|(_, v)| v).sum(),
        };
        if total <= 0.0 {
            continue;
        }
        for (i, (e, v)) in ranked.iter().enumerate() {
            let pct = 100.0 * v / total;
            if i >= ARTEFACT_RANK && pct < ARTEFACT_PCT {
                break; // ranked: everything below is smaller still
            }
            if pct < ARTEFACT_MIN_PCT {
                continue;
            }
            if let Some((kind, hint)) = artefact(&e.name) {
                out.push(ArtefactWarning {
                    side,
                    function: e.name.clone(),
                    kind,
                    rank: i + 1,
                    per_io: *v,
                    kernel_share_pct: pct,
                    hint,
                });
            }
        }
    }
    out
}

/// Name → instructions per IO, of one record's profile (`T`: the guest's
/// [`Instructions`] or the host's [`HostInstructions`]).
type PerName<T> = fn(&T) -> &BTreeMap<String, Option<f64>>;

/// One per-IO quantity of a record's profile.
type Scalar<T> = fn(&T) -> Option<f64>;

/// Per-IO values of `field` (name → per IO) over `records` (which all have
/// instruction counts); a name missing from a record, or null there,
/// counts as 0.
fn per_name<T>(records: &[&T], field: PerName<T>) -> BTreeMap<String, Vec<f64>> {
    let names: BTreeSet<String> = records
        .iter()
        .flat_map(|i| field(i).keys().cloned())
        .collect();
    names
        .into_iter()
        .map(|n| {
            let v = records
                .iter()
                .map(|i| field(i).get(&n).copied().flatten().unwrap_or(0.0))
                .collect();
            (n, v)
        })
        .collect()
}

fn entries(
    a: &BTreeMap<String, Vec<f64>>,
    b: &BTreeMap<String, Vec<f64>>,
    na: usize,
    nb: usize,
    group: impl Fn(&str) -> String,
) -> Vec<Entry> {
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut out: Vec<Entry> = names
        .into_iter()
        .map(|n| {
            let va = a.get(n).cloned().unwrap_or_else(|| vec![0.0; na]);
            let vb = b.get(n).cloned().unwrap_or_else(|| vec![0.0; nb]);
            Entry::of(n.clone(), group(n), &va, &vb)
        })
        .collect();
    // Separated differences first (the ones every run agrees on: the
    // plug path's functions, not a spin lock's noise), each by |diff|.
    out.sort_by(|x, y| {
        y.separated
            .cmp(&x.separated)
            .then(
                y.diff
                    .abs()
                    .partial_cmp(&x.diff.abs())
                    .unwrap_or(std::cmp::Ordering::Equal),
            )
            .then(
                y.a.mean
                    .max(y.b.mean)
                    .partial_cmp(&x.a.mean.max(x.b.mean))
                    .unwrap_or(std::cmp::Ordering::Equal),
            )
            .then(x.name.cmp(&y.name))
    });
    out
}

/// The profile of one row from each side's (ok) records; `None` when a
/// side has no instruction counts.
pub(crate) fn row_profile(
    scenario: &str,
    variant: &str,
    ra: &[&ResultRecord],
    rb: &[&ResultRecord],
    top: usize,
) -> Option<RowProfile> {
    let host = host_profile(ra, rb, top);
    let modelled = modelled(ra, rb);
    let ra: Vec<&Instructions> = ra.iter().filter_map(|r| r.instructions.as_ref()).collect();
    let rb: Vec<&Instructions> = rb.iter().filter_map(|r| r.instructions.as_ref()).collect();
    if ra.is_empty() || rb.is_empty() {
        return None;
    }
    let quantities: [(Scalar<Instructions>, &str); 12] = [
        (|i| i.kernel_per_io, "kernel instructions"),
        (|i| i.user_per_io, "user instructions"),
        (|i| i.per_io, "all instructions"),
        (|i| i.idle_entries_per_io, "idle entries"),
        (|i| i.context_switches_per_io, "context switches"),
        (|i| exits_per_io(i, "total"), "would-be exits"),
        (|i| exits_per_io(i, "hlt"), "would-be exits: HLT"),
        (|i| exits_per_io(i, "ipi"), "would-be exits: IPI sent"),
        (|i| exits_per_io(i, "timer"), "would-be exits: timer"),
        (|i| exits_per_io(i, "eoi"), "would-be exits: EOI"),
        (
            |i| exits_per_io(i, "notify"),
            "would-be exits: virtio notify",
        ),
        (|i| exits_per_io(i, "interrupts"), "interrupts taken"),
    ];
    let totals = totals(&ra, &rb, &quantities);
    let groups = entries(
        &per_name(&ra, |i| &i.groups),
        &per_name(&rb, |i| &i.groups),
        ra.len(),
        rb.len(),
        |g| g.to_string(),
    );
    let all = entries(
        &per_name(&ra, |i| &i.functions),
        &per_name(&rb, |i| &i.functions),
        ra.len(),
        rb.len(),
        |f| crate::record::symbol_groups::group_of(f).to_string(),
    );
    let kernel_mean = |rs: &[&Instructions]| {
        let v = scalar(rs, |i| i.kernel_per_io);
        (!v.is_empty()).then(|| side_value(&v).mean)
    };
    let warnings = artefacts(&all, (kernel_mean(&ra), kernel_mean(&rb)));
    let functions_diff_sum = all.iter().map(|e| e.diff).sum();
    let nonzero = all.iter().filter(|e| e.diff != 0.0).count();
    let functions: Vec<Entry> = all.into_iter().take(top).collect();
    Some(RowProfile {
        scenario: scenario.to_string(),
        variant: variant.to_string(),
        pair: None,
        kernel: None,
        a_label: "A".into(),
        b_label: "B".into(),
        totals,
        groups,
        more_functions: nonzero.saturating_sub(functions.len()),
        functions,
        functions_diff_sum,
        warnings,
        host,
        modelled,
    })
}

/// The modelled host cost's lines of one record: each term with a
/// non-zero weight in host instructions per IO, the exits' sum, the total,
/// and the halt polling in µs.
fn modelled_lines(m: &ModelledHostCost) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = m
        .terms
        .iter()
        .map(|t| match host_cost::weight(&t.name) {
            Some(w) => (format!("exits: {} (× {w})", t.name), t.per_io),
            None => (t.name.clone(), t.per_io),
        })
        .collect();
    out.push(("all exits".into(), m.exits_per_io));
    out.push(("modelled host instructions".into(), m.total_per_io));
    if let Some(us) = m.halt_poll_us_per_io {
        out.push(("halt polling, µs (not instructions)".into(), us));
    }
    out
}

/// The modelled host cost of a row, line by line in the model's order
/// (lines zero on both sides left out); empty unless both sides have it.
fn modelled(ra: &[&ResultRecord], rb: &[&ResultRecord]) -> Vec<Entry> {
    let lines = |rs: &[&ResultRecord]| -> Vec<Vec<(String, f64)>> {
        rs.iter()
            .filter_map(|r| host_cost::model(r))
            .map(|m| modelled_lines(&m))
            .collect()
    };
    let (la, lb) = (lines(ra), lines(rb));
    let (Some(first), false) = (la.first(), lb.is_empty()) else {
        return Vec::new();
    };
    let values = |ls: &[Vec<(String, f64)>], name: &str| -> Vec<f64> {
        ls.iter()
            .map(|l| l.iter().find(|(n, _)| n == name).map_or(0.0, |(_, v)| *v))
            .collect()
    };
    first
        .iter()
        .map(|(name, _)| {
            Entry::of(
                name.clone(),
                String::new(),
                &values(&la, name),
                &values(&lb, name),
            )
        })
        .filter(|e| e.a.mean != 0.0 || e.b.mean != 0.0)
        .collect()
}

/// The would-be exits of `reason` per IO (records with exit counts).
fn exits_per_io(i: &Instructions, reason: &str) -> Option<f64> {
    let e = i.exits.as_ref().filter(|e| e.unavailable.is_none())?;
    *e.per_io.get(reason)?
}

/// The values of `key` over `records` that have one.
fn scalar<T>(records: &[&T], key: Scalar<T>) -> Vec<f64> {
    records.iter().filter_map(|i| key(i)).collect()
}

/// One entry per quantity that both sides have, in `quantities`' order.
fn totals<T>(ra: &[&T], rb: &[&T], quantities: &[(Scalar<T>, &str)]) -> Vec<Entry> {
    let mut out = Vec::new();
    for (key, name) in quantities {
        let (va, vb) = (scalar(ra, *key), scalar(rb, *key));
        if va.is_empty() || vb.is_empty() {
            continue;
        }
        out.push(Entry::of(name.to_string(), String::new(), &va, &vb));
    }
    out
}

/// The host profiles of `records` that have functions.
fn host_sides<'a>(records: &[&'a ResultRecord]) -> Vec<&'a HostInstructions> {
    records
        .iter()
        .filter_map(|r| r.host_instructions.as_ref())
        .filter(|h| !h.functions.is_empty())
        .collect()
}

/// The host side of a row, when both sides' records carry the host's
/// functions (nested runs).
fn host_profile(ra: &[&ResultRecord], rb: &[&ResultRecord], top: usize) -> Option<HostProfile> {
    let (ha, hb) = (host_sides(ra), host_sides(rb));
    if ha.is_empty() || hb.is_empty() {
        return None;
    }
    let quantities: [(Scalar<HostInstructions>, &str); 4] = [
        (|h| h.kernel_per_io, "host kernel instructions"),
        (|h| h.user_per_io, "host user instructions"),
        (|h| h.per_io, "host instructions"),
        (|h| h.world_switches_per_io, "world switches"),
    ];
    let groups = entries(
        &per_name(&ha, |h| &h.groups),
        &per_name(&hb, |h| &h.groups),
        ha.len(),
        hb.len(),
        |g| g.to_string(),
    );
    let all = entries(
        &per_name(&ha, |h| &h.functions),
        &per_name(&hb, |h| &h.functions),
        ha.len(),
        hb.len(),
        |f| crate::record::symbol_groups::host_group_of(f).to_string(),
    );
    let functions_diff_sum = all.iter().map(|e| e.diff).sum();
    let nonzero = all.iter().filter(|e| e.diff != 0.0).count();
    let functions: Vec<Entry> = all.into_iter().take(top).collect();
    Some(HostProfile {
        totals: totals(&ha, &hb, &quantities),
        groups,
        more_functions: nonzero.saturating_sub(functions.len()),
        functions,
        functions_diff_sum,
    })
}

impl RowProfile {
    /// The heading of this profile.
    pub(crate) fn title(&self) -> String {
        match (&self.pair, &self.kernel) {
            (Some(p), Some(k)) => format!("{} on {k}", p.name()),
            (Some(p), None) => p.name(),
            _ => format!("{}/{}", self.scenario, self.variant),
        }
    }
}

/// One warning as a line of text: which side, the function, its rank,
/// count and share, and what it suggests.
pub(crate) fn warning_line(w: &ArtefactWarning, a: &str, b: &str) -> String {
    let (side, kernel) = if w.side == "a" { ("A", a) } else { ("B", b) };
    format!(
        "WARNING: {side} {kernel}: {} is #{} of the profile, {} instructions per IO \
         ({:.1} % of the kernel's), a measurement artefact ({}): {}",
        w.function,
        w.rank,
        crate::util::text::num(w.per_io),
        w.kernel_share_pct,
        w.kind,
        w.hint
    )
}

/// One table of a profile: its heading, its entries, and for a function
/// list the functions left out and the sum of every function's diff.
type Section<'a> = (&'a str, &'a Vec<Entry>, Option<(usize, f64)>);

/// Text (or Markdown) of the profiles; `sides` says what A and B are
/// (e.g. `A = 6.12, B = 6.12-noplug`).
pub(crate) fn render(profiles: &[RowProfile], sides: &str, markdown: bool) -> String {
    let mut out = String::new();
    if profiles.is_empty() {
        return out;
    }
    let head = render_head(profiles, sides);
    if markdown {
        out.push_str(&format!("**{head}**\n\n"));
    } else {
        out.push_str(&head);
        out.push('\n');
    }
    for p in profiles {
        let title = p.title();
        let (a, b) = (&p.a_label, &p.b_label);
        if markdown {
            out.push_str(&format!("*{title}*\n\n"));
            for w in &p.warnings {
                out.push_str(&format!("> **{}**\n\n", warning_line(w, a, b)));
            }
        } else {
            out.push_str(&format!("{title}\n"));
            for w in &p.warnings {
                out.push_str(&format!("  {}\n", warning_line(w, a, b)));
            }
        }
        for section in sections(p) {
            out.push_str(&table(&section_cells(section, a, b), markdown));
            out.push('\n');
        }
    }
    out
}

/// The line above the profiles: what they show, and whether host and
/// modelled profiles follow.
fn render_head(profiles: &[RowProfile], sides: &str) -> String {
    let host = if profiles.iter().any(|p| p.host.is_some()) {
        "; the host's of nested runs after them, its kernel functions from /proc/kallsyms"
    } else {
        ""
    };
    let modelled = if profiles.iter().any(|p| !p.modelled.is_empty()) {
        "; MODELLED: what a KVM host would spend, guest instructions + would-be exits × \
         host instructions per exit calibrated in the nested lab, not measured"
    } else {
        ""
    };
    format!(
        "differential profile: guest instructions per IO, B - A, mean ± sd over iterations \
         ({sides}; kernel functions from System.map, grouped by name{host}{modelled}; \
         = every run of one side beyond every run of the other, listed first)"
    )
}

/// A profile's tables, in order: totals, groups, functions, the modelled
/// host cost, and the host's totals, groups and functions.
fn sections(p: &RowProfile) -> Vec<Section<'_>> {
    let mut sections: Vec<Section> = vec![
        ("per IO", &p.totals, None),
        ("group", &p.groups, None),
        (
            "function",
            &p.functions,
            Some((p.more_functions, p.functions_diff_sum)),
        ),
    ];
    if !p.modelled.is_empty() {
        sections.push(("MODELLED host cost per IO", &p.modelled, None));
    }
    if let Some(h) = &p.host {
        sections.push(("host per IO", &h.totals, None));
        sections.push(("host group", &h.groups, None));
        sections.push((
            "host function",
            &h.functions,
            Some((h.more_functions, h.functions_diff_sum)),
        ));
    }
    sections
}

/// `mean ± sd`.
fn mean_sd(v: &SideValue) -> String {
    if v.sd == 0.0 {
        format!("{} ± 0", crate::util::text::num(v.mean))
    } else {
        format!(
            "{} ± {}",
            crate::util::text::num(v.mean),
            crate::util::text::num(v.sd)
        )
    }
}

/// The cells of one table of a profile (A and B named `a` and `b`): a
/// heading line, one line per entry, and for functions the ones left out;
/// the group column only for functions.
fn section_cells((what, list, more): Section, a: &str, b: &str) -> Vec<Vec<String>> {
    let keep_group = more.is_some();
    let group = |g: &str| {
        if keep_group {
            vec![g.to_string()]
        } else {
            Vec::new()
        }
    };
    let line = |first: String, g: &str, rest: [String; 3]| -> Vec<String> {
        let mut l = vec![first];
        l.extend(group(g));
        l.extend(rest);
        l
    };
    let mut cells = vec![line(
        what.to_string(),
        "group",
        [format!("A {a}"), format!("B {b}"), "B - A".into()],
    )];
    for e in list {
        cells.push(line(
            e.name.clone(),
            &e.group,
            [
                mean_sd(&e.a),
                mean_sd(&e.b),
                format!("{:+.1}{}", e.diff, if e.separated { " =" } else { "" }),
            ],
        ));
    }
    if let Some((n, sum)) = more.filter(|(n, _)| *n > 0) {
        cells.push(line(
            format!("({n} more functions differ)"),
            "",
            [String::new(), String::new(), format!("{sum:+.1} all")],
        ));
    }
    cells
}

fn table(cells: &[Vec<String>], markdown: bool) -> String {
    let mut out = String::new();
    if markdown {
        for (i, l) in cells.iter().enumerate() {
            let esc: Vec<String> = l.iter().map(|c| c.replace('|', "\\|")).collect();
            out.push_str(&format!("| {} |\n", esc.join(" | ")));
            if i == 0 {
                let al: Vec<&str> = (0..l.len())
                    .map(|j| {
                        if j == 0 || (l.len() == 5 && j == 1) {
                            "---"
                        } else {
                            "---:"
                        }
                    })
                    .collect();
                out.push_str(&format!("|{}|\n", al.join("|")));
            }
        }
        return out;
    }
    // Indented under the row's heading.
    let (lines, _) =
        crate::util::text::aligned_lines(cells, |l, i| i == 0 || (l.len() == 5 && i == 1));
    for line in lines {
        out.push_str("  ");
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::test_record;
    use serde_json::json;

    fn rec(f: &[(&str, f64)], kernel: f64) -> ResultRecord {
        let functions: BTreeMap<String, f64> = f.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        test_record(json!({"instructions": {
            "window": {"method": "test", "deterministic": true}, "ios": 1.0,
            "total": 0, "kernel": 0, "user": 0, "per_vcpu": [],
            "kernel_per_io": kernel, "user_per_io": 10.0, "per_io": kernel + 10.0,
            "idle_symbol": null, "idle_entries": null,
            "idle_entries_per_io": 0.1, "context_switches_per_io": 0.2,
            "groups": {"block": kernel}, "group_insns": {}, "functions": functions}}))
    }

    #[test]
    fn ranks_by_difference() {
        let a1 = rec(
            &[("blk_mq_flush_plug_list", 50.0), ("common", 100.0)],
            150.0,
        );
        let a2 = rec(
            &[("blk_mq_flush_plug_list", 50.0), ("common", 102.0)],
            152.0,
        );
        let b1 = rec(
            &[("blk_mq_try_issue_directly", 20.0), ("common", 101.0)],
            121.0,
        );
        let b2 = rec(
            &[("blk_mq_try_issue_directly", 20.0), ("common", 101.0)],
            121.0,
        );
        let p = row_profile("s", "v", &[&a1, &a2], &[&b1, &b2], 2).unwrap();
        assert_eq!(p.functions[0].name, "blk_mq_flush_plug_list");
        assert!(p.functions[0].separated);
        assert_eq!(p.functions[0].diff, -50.0);
        assert_eq!(p.functions[0].a.sd, 0.0);
        assert_eq!(p.functions[1].name, "blk_mq_try_issue_directly");
        assert_eq!(p.functions[1].group, "block");
        assert_eq!(p.more_functions, 0);
        assert!((p.functions_diff_sum - (-50.0 + 20.0 + 0.0)).abs() < 1e-9);
        assert_eq!(p.totals[0].name, "kernel instructions");
        let t = render(&[p], "A = a, B = b", false);
        assert!(t.contains("blk_mq_flush_plug_list"), "{t}");
        assert!(t.contains("-50.0"), "{t}");
        assert!(row_profile("s", "v", &[&test_record(json!({}))], &[&b1], 2).is_none());
        assert!(!t.contains("WARNING"), "{t}");
    }

    #[test]
    fn would_be_exits_join_the_totals_when_both_sides_count_them() {
        let with_exits = |hlt: f64| {
            let mut r = rec(&[("common", 100.0)], 100.0);
            let i = r.instructions.as_mut().unwrap();
            i.exits = Some(crate::record::instructions::WouldBeExits {
                per_io: [
                    ("total".to_string(), Some(hlt + 1.0)),
                    ("hlt".to_string(), Some(hlt)),
                ]
                .into(),
                ..Default::default()
            });
            r
        };
        let (a, b) = (with_exits(0.5), with_exits(0.25));
        let p = row_profile("s", "v", &[&a], &[&b], 2).unwrap();
        let hlt = p
            .totals
            .iter()
            .find(|e| e.name == "would-be exits: HLT")
            .unwrap();
        assert_eq!(hlt.diff, -0.25);
        assert!(p.totals.iter().any(|e| e.name == "would-be exits"));
        // One side without exit counts (older records): no exit rows.
        let old = rec(&[("common", 100.0)], 100.0);
        let p = row_profile("s", "v", &[&a], &[&old], 2).unwrap();
        assert!(!p.totals.iter().any(|e| e.name.starts_with("would-be")));
    }

    #[test]
    fn the_modelled_host_cost_is_its_own_section_term_by_term() {
        let with_exits = |hlt: u64, notify: u64| {
            let mut r = rec(&[("common", 100.0)], 100.0);
            let i = r.instructions.as_mut().unwrap();
            i.exits = Some(crate::record::instructions::WouldBeExits {
                hlt,
                notify,
                ..Default::default()
            });
            r
        };
        let (a, b) = (with_exits(1, 2), with_exits(1, 3));
        let p = row_profile("s", "v", &[&a], &[&b], 2).unwrap();
        let line = |name: &str| p.modelled.iter().find(|e| e.name.starts_with(name));
        let w = |r: &str| host_cost::weight(r).unwrap() as f64;
        assert_eq!(line("guest instructions").unwrap().a.mean, 110.0);
        assert_eq!(line("exits: notify").unwrap().diff, w("notify"));
        assert_eq!(line("exits: hlt").unwrap().diff, 0.0);
        let total = line("modelled host instructions").unwrap();
        assert_eq!(total.a.mean, 110.0 + w("hlt") + 2.0 * w("notify"));
        // Reasons no side has are left out; no idle time, no polling line.
        assert!(line("exits: ipi").is_none());
        assert!(line("halt polling").is_none());
        let t = render(&[p], "A = a, B = b", false);
        assert!(t.contains("MODELLED host cost per IO"), "{t}");
        // Without exit counts on one side: no model.
        let old = rec(&[("common", 100.0)], 100.0);
        assert!(row_profile("s", "v", &[&a], &[&old], 2)
            .unwrap()
            .modelled
            .is_empty());
    }

    /// `rec` of a nested run: the host's kernel functions (per IO) and
    /// world switches per IO.
    fn nested(f: &[(&str, f64)], host: &[(&str, f64)], switches: f64) -> ResultRecord {
        let mut r = rec(f, 100.0);
        let kernel: f64 = host.iter().map(|(_, v)| v).sum();
        r.host_instructions = Some(HostInstructions {
            ios: Some(1.0),
            kernel_per_io: Some(kernel),
            user_per_io: Some(500.0),
            per_io: Some(kernel + 500.0),
            world_switches_per_io: Some(switches),
            functions: host
                .iter()
                .map(|(k, v)| (k.to_string(), Some(*v)))
                .collect(),
            groups: [("kvm".to_string(), Some(kernel))].into(),
            ..Default::default()
        });
        r
    }

    #[test]
    fn host_side_of_nested_runs() {
        let guest = [("blk_mq_flush_plug_list", 50.0)];
        let a = nested(
            &guest,
            &[
                ("svm_vcpu_run [kvm_amd]", 300.0),
                ("kvm_arch_vcpu_ioctl_run [kvm]", 200.0),
            ],
            2.0,
        );
        let b = nested(
            &guest,
            &[
                ("svm_vcpu_run [kvm_amd]", 450.0),
                ("kvm_arch_vcpu_ioctl_run [kvm]", 200.0),
            ],
            3.0,
        );
        let p = row_profile("s", "v", &[&a], &[&b], 5).unwrap();
        let h = p.host.as_ref().expect("a host profile");
        assert_eq!(h.functions[0].name, "svm_vcpu_run [kvm_amd]");
        assert_eq!(h.functions[0].group, "kvm");
        assert_eq!(h.functions[0].diff, 150.0);
        assert_eq!(h.functions_diff_sum, 150.0);
        let names: Vec<&str> = h.totals.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "host kernel instructions",
                "host user instructions",
                "host instructions",
                "world switches"
            ]
        );
        assert_eq!(h.totals[3].diff, 1.0);
        assert_eq!(h.groups[0].name, "kvm");
        let t = render(std::slice::from_ref(&p), "A = a, B = b", false);
        assert!(t.contains("host function"), "{t}");
        assert!(t.contains("svm_vcpu_run [kvm_amd]"), "{t}");
        assert!(t.contains("/proc/kallsyms"), "{t}");
        let md = render(std::slice::from_ref(&p), "A = a, B = b", true);
        assert!(md.contains("| host function | group |"), "{md}");
        // One side without the host's profile: none, and the text is the
        // guest's alone.
        let plain = rec(&guest, 100.0);
        let q = row_profile("s", "v", &[&a], &[&plain], 5).unwrap();
        assert!(q.host.is_none());
        let t = render(&[q], "A = a, B = b", false);
        assert!(!t.contains("host") && !t.contains("kallsyms"), "{t}");
        assert!(serde_json::to_value(&p).unwrap()["host"]["functions"].is_array());
    }

    /// A 5.10 built from plain tinyconfig: the HPET clocksource and SLOB on
    /// top of side B's profile.
    #[test]
    fn artefacts_on_top_warn() {
        let clean = [
            ("bio_first_folio", 306.0),
            ("virtqueue_add_split", 302.0),
            ("gup_fast_fallback", 280.0),
            ("aio_read_events", 277.0),
            ("__schedule", 221.0),
            ("read_tsc", 17.0),
            ("get_page_from_freelist", 20.0),
            ("___slab_alloc", 1.0),
        ];
        let a = rec(&clean, 10_000.0);
        let mut dirty = clean.to_vec();
        dirty.push(("read_hpet", 3000.0));
        dirty.push(("slob_page_alloc.constprop.0", 900.0));
        dirty.push(("native_queued_spin_lock_slowpath", 40.0));
        let b = rec(&dirty, 14_000.0);
        let p = row_profile("s", "v", &[&a, &a], &[&b, &b], 3).unwrap();
        let w: Vec<(&str, &str, usize)> = p
            .warnings
            .iter()
            .map(|w| (w.side, w.function.as_str(), w.rank))
            .collect();
        assert_eq!(
            w,
            vec![
                ("b", "read_hpet", 1),
                ("b", "slob_page_alloc.constprop.0", 2)
            ],
            "{:?}",
            p.warnings
        );
        let hpet = &p.warnings[0];
        assert_eq!(hpet.kind, "clock read");
        assert_eq!(hpet.per_io, 3000.0);
        assert!((hpet.kernel_share_pct - 100.0 * 3000.0 / 14_000.0).abs() < 1e-9);
        assert!(hpet.hint.contains("clocksource"), "{}", hpet.hint);
        assert_eq!(p.warnings[1].kind, "allocator slow path");
        assert!(p.warnings[1].hint.contains("SLOB"));
        // The text and Markdown tables carry them, naming side and kernel.
        let mut p = p;
        p.a_label = "6.12".into();
        p.b_label = "5.10".into();
        let t = render(std::slice::from_ref(&p), "A = 6.12, B = 5.10", false);
        assert!(
            t.contains(
                "WARNING: B 5.10: read_hpet is #1 of the profile, 3000 instructions per IO (21.4 % of the kernel's)"
            ),
            "{t}"
        );
        assert!(t.contains("the clocksource is the HPET?"), "{t}");
        let md = render(std::slice::from_ref(&p), "A = 6.12, B = 5.10", true);
        assert!(md.contains("> **WARNING: B 5.10: read_hpet"), "{md}");
        // And the JSON.
        let j = serde_json::to_value(&p).unwrap();
        assert_eq!(j["warnings"][0]["function"], "read_hpet");
        assert_eq!(j["warnings"][0]["side"], "b");
        assert_eq!(j["warnings"][0]["rank"], 1);
        // The clean side, on its own, has none.
        let q = row_profile("s", "v", &[&a], &[&a], 3).unwrap();
        assert!(q.warnings.is_empty(), "{:?}", q.warnings);
        assert!(!render(&[q], "A, B", false).contains("WARNING"));
    }

    /// A spinning lock far down the ranks but over 5 % of the kernel's
    /// instructions still warns; one in the top 5 under 1 % does not.
    #[test]
    fn artefact_thresholds() {
        let mut f: Vec<(String, f64)> = (0..10)
            .map(|i| (format!("f{i}"), 1000.0 - i as f64))
            .collect();
        f.push(("__pv_queued_spin_lock_slowpath".into(), 600.0));
        let fs: Vec<(&str, f64)> = f.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let r = rec(&fs, 10_000.0);
        let p = row_profile("s", "v", &[&r], &[&r], 3).unwrap();
        let names: Vec<(&str, usize)> = p.warnings.iter().map(|w| (w.side, w.rank)).collect();
        assert_eq!(names, vec![("a", 11), ("b", 11)], "{:?}", p.warnings);
        assert_eq!(p.warnings[0].kind, "lock spinning");
        let tiny = rec(&[("read_hpet", 50.0), ("x", 40.0)], 10_000.0);
        let p = row_profile("s", "v", &[&tiny], &[&tiny], 3).unwrap();
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(artefact("acpi_pm_read").map(|a| a.0), Some("clock read"));
        assert_eq!(artefact("pvclock_clocksource_read"), None);
        assert_eq!(artefact("read_tsc"), None);
    }
}
