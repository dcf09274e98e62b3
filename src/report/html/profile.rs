//! A row's differential instruction profile on the page: warnings, totals,
//! groups and functions (with their bar plot beside), the modelled host
//! cost, and the host's own profile of a nested run.

use maud::{html, Markup};

use super::table::{anchor, Cell, Col, Table, Tint};
use super::{beside, file_safe, plots, Page};
use crate::report::profile::{warning_line, Entry, HostProfile, RowProfile};

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

/// The functions' bars: B − A per function, whiskers sd(A) + sd(B); `None`
/// without functions.
fn functions_figure(
    page: &mut Page,
    p: &RowProfile,
    base: &str,
) -> std::io::Result<Option<Markup>> {
    if p.functions.is_empty() {
        return Ok(None);
    }
    let bars: Vec<plots::DiffBar> = p
        .functions
        .iter()
        .map(|e| plots::DiffBar {
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
    page.figure(&format!("{}.svg", file_safe(base)), &svg, "profile")
        .map(Some)
}

/// The guest's tables: totals, groups, and the functions with their plot.
fn guest(page: &mut Page, p: &RowProfile, base: &str) -> std::io::Result<Markup> {
    let id = |part: &str| format!("{base}-{part}");
    let totals = profile_table(&id("totals"), "per IO", "per IO", &p.totals, false, p);
    let groups = profile_table(
        &id("groups"),
        "kernel instructions per IO by group",
        "group",
        &p.groups,
        false,
        p,
    );
    let mut functions = profile_table(
        &id("functions"),
        "kernel instructions per IO by function: the largest differences",
        "function",
        &p.functions,
        true,
        p,
    );
    functions_foot(&mut functions, true, p.more_functions, p.functions_diff_sum);
    let figure = functions_figure(page, p, base)?;
    Ok(html! { (totals) (groups) (beside(&functions, figure)) })
}

/// What a KVM host would spend per IO: a model, said so.
fn modelled(p: &RowProfile, base: &str) -> Markup {
    if p.modelled.is_empty() {
        return html! {};
    }
    let table = profile_table(
        &format!("{base}-modelled"),
        "MODELLED host instructions per IO",
        "modelled per IO",
        &p.modelled,
        false,
        p,
    );
    html! {
        h4 { "Modelled host cost (not measured)" }
        p.legend {
            "What a KVM host would spend per IO on this guest: its instructions, plus each \
             would-be exit times the host instructions one such exit cost in the nested lab's \
             calibration (the weight in brackets), plus halt polling in µs. A model: see the \
             user guide's " em { "Modelled host cost" } "."
        }
        (table)
    }
}

/// The host's profile of a nested run: totals, groups, functions.
fn host(h: &HostProfile, p: &RowProfile, base: &str) -> Markup {
    let id = |part: &str| format!("{base}-host-{part}");
    let totals = profile_table(
        &id("totals"),
        "host per IO",
        "host per IO",
        &h.totals,
        false,
        p,
    );
    let groups = profile_table(
        &id("groups"),
        "host kernel instructions per IO by group",
        "host group",
        &h.groups,
        false,
        p,
    );
    let mut functions = profile_table(
        &id("functions"),
        "host kernel instructions per IO by function",
        "host function",
        &h.functions,
        true,
        p,
    );
    functions_foot(&mut functions, true, h.more_functions, h.functions_diff_sum);
    html! { h4 { "The host's profile (nested run)" } (totals) (groups) (functions) }
}

/// A row's differential profile: warnings, totals, groups and functions
/// (with their plot beside), and the host's when there is one.
pub(super) fn profile(page: &mut Page, p: &RowProfile) -> std::io::Result<Markup> {
    let base = anchor(&format!("profile-{}", p.title()));
    let guest = guest(page, p, &base)?;
    Ok(html! {
        h4 {
            "Differential instruction profile"
            @if let Some(k) = &p.kernel { " on " (k) }
        }
        p.legend {
            "Guest instructions per IO, mean, sd, n, min and max over the runs of each side \
             (A = " (p.a_label) ", B = " (p.b_label) "); functions from the kernel's \
             System.map, grouped by name; = every run of one side beyond every run of the \
             other."
        }
        @for w in &p.warnings {
            p.warning { strong { (warning_line(w, &p.a_label, &p.b_label)) } }
        }
        (guest)
        (modelled(p, &base))
        @if let Some(h) = &p.host { (host(h, p, &base)) }
    })
}
