//! The check of a report's records against the contract: which records
//! each kind of report pools and compares (a kernel's rows across the
//! sides, a pair's two variants on one side, both for the difference in
//! differences), and every difference of a [`Condition`] among them.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{device_identity, parallelism, run_value, Condition, Scope};
use crate::record::result::ResultRecord;
use crate::record::run::RunDocument;
use crate::record::scenario::Variant;
use crate::report::load::Side;
use crate::report::profile::RowPair;

/// (scenario, variant).
type Key = (String, String);

/// Something that differs between what a report compares.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    pub(crate) what: String,
    /// The condition of the contract, when it is one (a QEMU command line,
    /// the host: shown, never a condition).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) condition: Option<Condition>,
    pub(crate) a: String,
    pub(crate) b: String,
    /// Refuses the comparison unless forced.
    pub(crate) blocking: bool,
    /// The two variants of a pair, which differ by design (never blocking).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) by_design: bool,
    /// Within one side (`A` or `B`): its records disagree (`a` is the
    /// most common value, `b` the others).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) within: Option<String>,
    /// The rows it concerns (a variant's condition); empty: every row.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) rows: Vec<String>,
}

impl Difference {
    /// The same difference (rows apart).
    fn same(&self, o: &Difference) -> bool {
        (&self.what, &self.a, &self.b, &self.within, self.by_design)
            == (&o.what, &o.a, &o.b, &o.within, o.by_design)
    }
}

/// A record as a difference names it: `KERNEL SCENARIO/VARIANT #N`.
fn record_name(r: &ResultRecord) -> String {
    format!("{} {}/{} #{}", r.kernel, r.scenario, r.variant, r.iteration)
}

/// The records a check reads: a side's run document and some of its
/// records.
pub(crate) struct Records<'a> {
    pub(crate) run: &'a RunDocument,
    pub(crate) records: Vec<&'a ResultRecord>,
}

impl Records<'_> {
    /// Each distinct value of `c` with the records that have it, the most
    /// common first.
    fn values(&self, c: Condition) -> Vec<(Option<String>, Vec<&ResultRecord>)> {
        let mut by: BTreeMap<Option<String>, Vec<&ResultRecord>> = BTreeMap::new();
        for r in &self.records {
            let v = c.value(self.run, r);
            if v.is_some() || c.unknown_differs() {
                by.entry(v).or_default().push(r);
            }
        }
        let mut v: Vec<_> = by.into_iter().collect();
        v.sort_by_key(|(_, rs)| std::cmp::Reverse(rs.len()));
        v
    }

    /// The one value of `c` in these records, or the difference within
    /// them (`side` names them).
    fn one_value(&self, c: Condition, side: &str) -> Result<Option<String>, Difference> {
        let mut values = self.values(c);
        if values.len() <= 1 {
            return Ok(values.pop().and_then(|(v, _)| v));
        }
        let show = |(v, rs): &(Option<String>, Vec<&ResultRecord>)| {
            let example = rs.first().map(|r| record_name(r)).unwrap_or_default();
            format!("{} ({} record(s), e.g. {example})", c.show(v), rs.len())
        };
        let others: Vec<String> = values[1..].iter().map(show).collect();
        Err(Difference {
            what: c.name().to_string(),
            condition: Some(c),
            a: show(&values[0]),
            b: others.join("; "),
            blocking: true,
            by_design: false,
            within: Some(side.to_string()),
            rows: Vec::new(),
        })
    }
}

/// What the check of a report's records is asked.
pub(crate) struct Check<'a> {
    /// Each side's records that the report reads, with the side's name.
    pub(crate) sides: Vec<(&'a str, Records<'a>)>,
    /// The rows: for each, the groups of records compared against each
    /// other, as (side index, records), and whether the groups are a
    /// pair's two variants (which differ by design in a variant's
    /// conditions).
    pub(crate) rows: Vec<RowGroups<'a>>,
    /// Whether the report shows a backend metric.
    pub(crate) backend_metric: bool,
}

/// The groups of one row: `across` are compared with each other (the same
/// variant on the two sides), `pair` the variants of a pair.
pub(crate) struct RowGroups<'a> {
    pub(crate) name: String,
    /// Records of one variant on side A and side B.
    pub(crate) across: Vec<[Records<'a>; 2]>,
    /// A pair's base and other variant on one side (named).
    pub(crate) pair: Vec<(&'a str, [Records<'a>; 2])>,
}

impl<'a> Check<'a> {
    /// Kernel B against kernel A: each row's variant on the two sides.
    pub(crate) fn kernels(a: &'a Side, b: &'a Side, keys: &[Key], backend_metric: bool) -> Self {
        Check {
            sides: vec![("A", side_records(a, keys)), ("B", side_records(b, keys))],
            rows: keys
                .iter()
                .map(|k| RowGroups {
                    name: format!("{}/{}", k.0, k.1),
                    across: vec![[group(a, k), group(b, k)]],
                    pair: Vec::new(),
                })
                .collect(),
            backend_metric,
        }
    }

    /// Variant pairs (base, other) on one kernel: the pair's two variants,
    /// which differ by design in a variant's conditions.
    pub(crate) fn pairs(a: &'a Side, pairs: &[(Key, Key)], backend_metric: bool) -> Self {
        Check {
            sides: vec![("A", side_records(a, &pair_keys(pairs)))],
            rows: pairs
                .iter()
                .map(|(base, other)| RowGroups {
                    name: RowPair::of(base, other).name(),
                    across: Vec::new(),
                    pair: vec![("A", [group(a, base), group(a, other)])],
                })
                .collect(),
            backend_metric,
        }
    }

    /// The pairs' difference in differences on two kernels: each variant
    /// across the sides, and each side's pair.
    pub(crate) fn did(
        a: &'a Side,
        b: &'a Side,
        pairs: &[(Key, Key)],
        backend_metric: bool,
    ) -> Self {
        let used = pair_keys(pairs);
        Check {
            sides: vec![("A", side_records(a, &used)), ("B", side_records(b, &used))],
            rows: pairs
                .iter()
                .map(|(base, other)| RowGroups {
                    name: RowPair::of(base, other).name(),
                    across: vec![
                        [group(a, base), group(b, base)],
                        [group(a, other), group(b, other)],
                    ],
                    pair: vec![
                        ("A", [group(a, base), group(a, other)]),
                        ("B", [group(b, base), group(b, other)]),
                    ],
                })
                .collect(),
            backend_metric,
        }
    }
}

impl Check<'_> {
    /// The warning of every record the report reads whose vCPUs could not
    /// all run at once (contention between them cannot show), once each.
    pub(crate) fn parallelism_warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (_, recs) in &self.sides {
            for r in &recs.records {
                if let Some(w) = parallelism(recs.run, r).and_then(|p| p.warning()) {
                    if !out.contains(&w) {
                        out.push(w);
                    }
                }
            }
        }
        out
    }
}

/// Every (scenario, variant) the pairs use, once each.
fn pair_keys(pairs: &[(Key, Key)]) -> Vec<Key> {
    let mut used: Vec<Key> = Vec::new();
    for k in pairs.iter().flat_map(|(x, y)| [x, y]) {
        if !used.contains(k) {
            used.push(k.clone());
        }
    }
    used
}

/// A side's records of one (scenario, variant), failed ones included.
fn group<'a>(side: &'a Side, (s, v): &Key) -> Records<'a> {
    Records {
        run: &side.run,
        records: side
            .records
            .iter()
            .filter(|r| &r.scenario == s && &r.variant == v)
            .collect(),
    }
}

/// A side's records of the rows a report shows.
fn side_records<'a>(side: &'a Side, keys: &[Key]) -> Records<'a> {
    Records {
        run: &side.run,
        records: side
            .records
            .iter()
            .filter(|r| {
                keys.iter()
                    .any(|(s, v)| &r.scenario == s && &r.variant == v)
            })
            .collect(),
    }
}

/// Whether a difference in `c` blocks: everything but the blklab version
/// where no backend metric is shown.
fn blocks(c: Condition, backend_metric: bool) -> bool {
    c != Condition::BlklabVersion || backend_metric
}

/// Every difference of the contract's conditions in what `check` reads.
pub(crate) fn differences(check: &Check) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut push = |mut d: Difference| {
        if let Some(c) = d.condition {
            d.blocking = d.blocking && blocks(c, check.backend_metric);
        }
        match out.iter_mut().find(|o: &&mut Difference| o.same(&d)) {
            Some(o) => {
                for r in d.rows {
                    if !o.rows.contains(&r) {
                        o.rows.push(r);
                    }
                }
            }
            None => out.push(d),
        }
    };
    // Within each side: run-wide and kernel conditions over all its records.
    for (name, recs) in &check.sides {
        for c in Condition::ALL {
            if c.scope() != Scope::Variant {
                if let Err(d) = recs.one_value(c, name) {
                    push(d);
                }
            }
        }
    }
    for row in &check.rows {
        for [a, b] in &row.across {
            for c in Condition::ALL {
                let Some((va, vb)) = row_values(c, &row.name, [a, b], ["A", "B"], &mut push) else {
                    continue;
                };
                if c.differ(&va, &vb) && c.scope() != Scope::Kernel {
                    push(across(c, &row.name, &va, &vb, a, b));
                }
            }
        }
        for (side, [base, other]) in &row.pair {
            for c in Condition::ALL {
                let Some((vb, vo)) =
                    row_values(c, &row.name, [base, other], [side, side], &mut push)
                else {
                    continue;
                };
                if c.differ(&vb, &vo) {
                    let mut d = across(c, &row.name, &vb, &vo, base, other);
                    if c.scope() == Scope::Variant {
                        d.blocking = false;
                        d.by_design = true;
                        d.what = match c {
                            Condition::ScenarioDefinition => format!("variants {}", row.name),
                            _ => format!("variants {} ({})", row.name, c.name()),
                        };
                        d.rows.clear();
                    }
                    push(d);
                }
            }
        }
    }
    out
}

/// The values of `c` in a row's two groups; `None` when a group's records
/// disagree (a variant's condition: pushed here as a difference within
/// its side; any other was found over the whole side).
fn row_values(
    c: Condition,
    row: &str,
    groups: [&Records; 2],
    sides: [&str; 2],
    push: &mut impl FnMut(Difference),
) -> Option<(Option<String>, Option<String>)> {
    let va = groups[0].one_value(c, sides[0]);
    let vb = groups[1].one_value(c, sides[1]);
    match (va, vb) {
        (Ok(va), Ok(vb)) => Some((va, vb)),
        (Err(d), _) | (_, Err(d)) => {
            if c.scope() == Scope::Variant {
                push(Difference {
                    rows: vec![row.to_string()],
                    ..d
                });
            }
            None
        }
    }
}

/// The difference of `c` between two groups' values.
fn across(
    c: Condition,
    row: &str,
    va: &Option<String>,
    vb: &Option<String>,
    a: &Records,
    b: &Records,
) -> Difference {
    let (sa, sb) = match (c, a.records.first(), b.records.first()) {
        (Condition::DeviceModel, Some(ra), Some(rb)) => device_fields(ra, rb),
        (Condition::VcpusAtOnce, Some(ra), Some(rb)) => {
            match (parallelism(a.run, ra), parallelism(b.run, rb)) {
                (Some(pa), Some(pb)) => (pa.describe(), pb.describe()),
                _ => (c.show(va), c.show(vb)),
            }
        }
        (Condition::ScenarioDefinition, Some(ra), Some(rb)) => {
            match (&ra.scenario_definition, &rb.scenario_definition) {
                (Some(x), Some(y)) => {
                    definition_difference(x, y).unwrap_or_else(|| (c.show(va), c.show(vb)))
                }
                _ => (c.show(va), c.show(vb)),
            }
        }
        _ => (c.show(va), c.show(vb)),
    };
    let rows = match c.scope() {
        Scope::Variant => vec![row.to_string()],
        _ => Vec::new(),
    };
    Difference {
        what: c.name().to_string(),
        condition: Some(c),
        a: sa,
        b: sb,
        blocking: true,
        by_design: false,
        within: None,
        rows,
    }
}

/// How two records' backend configurations differ: the fields that differ
/// (of the first disk whose configuration differs), and the disk counts
/// when they differ.
fn device_fields(a: &ResultRecord, b: &ResultRecord) -> (String, String) {
    let (da, db) = (device_identity(a), device_identity(b));
    let disks = |d: &Value| d.as_array().map_or(0, Vec::len);
    let pick = |d: &Value, i: usize| d.get(i).cloned().unwrap_or(Value::Null);
    let i = (0..disks(&da).max(disks(&db)))
        .find(|&i| pick(&da, i) != pick(&db, i))
        .unwrap_or(0);
    let (fa, fb) = (pick(&da, i), pick(&db, i));
    let mut fields: Vec<String> = Vec::new();
    if let (Some(oa), Some(ob)) = (fa.as_object(), fb.as_object()) {
        let mut keys: Vec<&String> = oa.keys().chain(ob.keys()).collect();
        keys.sort();
        keys.dedup();
        fields = keys
            .into_iter()
            .filter(|k| oa.get(*k) != ob.get(*k))
            .cloned()
            .collect();
    }
    let show = |o: &Value, d: &Value| {
        let mut parts: Vec<String> = fields
            .iter()
            .map(|k| format!("{k}={}", o.get(k).cloned().unwrap_or(Value::Null)))
            .collect();
        if fields.is_empty() && disks(&da) == disks(&db) {
            parts.push(o.to_string());
        }
        if disks(&da) != disks(&db) {
            parts.push(format!("disks={}", disks(d)));
        }
        parts.join(" ")
    };
    (show(&fa, &da), show(&fb, &db))
}

/// How two variants' definitions differ: (A's, B's), the differing fields
/// only (for argument lists, the arguments only one of them has).
fn definition_difference(a: &Variant, b: &Variant) -> Option<(String, String)> {
    let mut pa: Vec<String> = Vec::new();
    let mut pb: Vec<String> = Vec::new();
    let mut field = |name: &str, x: String, y: String| {
        if x != y {
            pa.push(format!("{name}={x}"));
            pb.push(format!("{name}={y}"));
        }
    };
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let optn = |v: &Option<u64>| v.map_or("-".into(), |n| n.to_string());
    field("target", a.target.kind.clone(), b.target.kind.clone());
    let stack = |v: &Variant| {
        v.stack.as_ref().map_or("-".into(), |s| {
            std::iter::once(s.kind.as_str())
                .chain(s.params.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(",")
        })
    };
    field("stack", stack(a), stack(b));
    field("sched", opt(&a.sched), opt(&b.sched));
    field("nr_requests", optn(&a.nr_requests), optn(&b.nr_requests));
    field("queue_depth", optn(&a.queue_depth), optn(&b.queue_depth));
    field("nomerges", optn(&a.nomerges), optn(&b.nomerges));
    field("rq_affinity", optn(&a.rq_affinity), optn(&b.rq_affinity));
    field(
        "layout",
        a.layout.as_str().to_string(),
        b.layout.as_str().to_string(),
    );
    field("runtime", a.runtime.to_string(), b.runtime.to_string());
    field("ramp", a.ramp.to_string(), b.ramp.to_string());
    let mut list = |name: &str, x: &[String], y: &[String]| {
        let only = |p: &[String], q: &[String]| -> Vec<String> {
            p.iter().filter(|e| !q.contains(e)).cloned().collect()
        };
        let (ox, oy) = (only(x, y), only(y, x));
        if !ox.is_empty() || !oy.is_empty() {
            let show = |v: Vec<String>| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.join(" ")
                }
            };
            pa.push(format!("{name}: {}", show(ox)));
            pb.push(format!("{name}: {}", show(oy)));
        } else if x != y {
            pa.push(format!("{name} order: {}", x.join(" ")));
            pb.push(format!("{name} order: {}", y.join(" ")));
        }
    };
    list("target params", &a.target.params, &b.target.params);
    list("device", &a.device, &b.device);
    list("fio args", &a.fio_args, &b.fio_args);
    (!pa.is_empty()).then(|| (pa.join("; "), pb.join("; ")))
}

/// The run document's own run-wide values against a record's: a record
/// whose run-wide conditions are not its run.json's (a record edited, or
/// copied in with another run's id) shows as a difference within its side.
pub(crate) fn run_document_disagreements(side: &str, recs: &Records) -> Vec<Difference> {
    let mut out = Vec::new();
    for c in Condition::ALL {
        let Some(want) = run_value(c, recs.run) else {
            continue;
        };
        let off: Vec<&ResultRecord> = recs
            .records
            .iter()
            .copied()
            .filter(|r| c.value(recs.run, r).as_ref() != Some(&want))
            .collect();
        if let Some(first) = off.first() {
            out.push(Difference {
                what: c.name().to_string(),
                condition: Some(c),
                a: format!("{want} (run.json)"),
                b: format!(
                    "{} ({} record(s), e.g. {})",
                    c.show(&c.value(recs.run, first)),
                    off.len(),
                    record_name(first)
                ),
                blocking: true,
                by_design: false,
                within: Some(side.to_string()),
                rows: Vec::new(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::test_record;
    use serde_json::json;

    fn fixture_run() -> RunDocument {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/runs/aa");
        crate::record::read(&std::path::Path::new(dir).join("run.json")).unwrap()
    }

    /// A record of `vcpus` vCPUs on `usable` host cores (`None`: a record
    /// older than the field).
    fn rec(kernel: &str, at: Option<(u32, u32)>) -> ResultRecord {
        let p = at.map(|(vcpus, usable)| {
            json!({"host_cores_online": 16, "host_cores_usable": usable,
                   "vcpu_threads": "per_vcpu", "vcpus": vcpus,
                   "vcpus_at_once": vcpus.min(usable)})
        });
        let mut fields = json!({"kernel": kernel});
        if let Some(p) = p {
            fields["parallelism"] = p;
        }
        test_record(fields)
    }

    fn records<'a>(run: &'a RunDocument, rs: &'a [ResultRecord]) -> Records<'a> {
        Records {
            run,
            records: rs.iter().collect(),
        }
    }

    /// The differences of kernel B's records against kernel A's, one row.
    fn across_sides(run: &RunDocument, a: &[ResultRecord], b: &[ResultRecord]) -> Vec<Difference> {
        differences(&Check {
            sides: vec![("A", records(run, a)), ("B", records(run, b))],
            rows: vec![RowGroups {
                name: "s/v".into(),
                across: vec![[records(run, a), records(run, b)]],
                pair: Vec::new(),
            }],
            backend_metric: false,
        })
    }

    #[test]
    fn vcpus_at_once_differ_across_sides_but_unknown_and_equal_do_not() {
        let run = fixture_run();
        let d = across_sides(
            &run,
            &[rec("a", Some((16, 2)))],
            &[rec("b", Some((16, 16)))],
        );
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].condition, Some(Condition::VcpusAtOnce));
        assert!(d[0].blocking);
        assert_eq!(d[0].what, "vCPUs at once");
        assert_eq!(d[0].a, "2 (16 vCPUs, 2 usable host cores)");
        assert_eq!(d[0].b, "16 (16 vCPUs, 16 usable host cores)");
        assert_eq!(d[0].rows, ["s/v"]);
        // Unknown on one side is no difference; nor are other cores that
        // run every vCPU.
        let unknown = across_sides(&run, &[rec("a", Some((16, 2)))], &[rec("b", None)]);
        assert!(unknown.is_empty(), "{unknown:?}");
        let same = across_sides(&run, &[rec("a", Some((2, 2)))], &[rec("b", Some((2, 16)))]);
        assert!(same.is_empty(), "{same:?}");
    }

    #[test]
    fn vcpus_at_once_differ_within_a_side_and_by_design_in_a_pair() {
        let run = fixture_run();
        let a = [
            rec("a", Some((4, 2))),
            rec("a", Some((4, 16))),
            rec("a", None),
        ];
        let b = [rec("b", Some((4, 2)))];
        let d = across_sides(&run, &a, &b);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].within.as_deref(), Some("A"));
        assert!(d[0].blocking, "{d:?}");
        // A pair's variants of 16 and 1 vCPUs on 2 cores: by design.
        let (base, other) = ([rec("a", Some((16, 2)))], [rec("a", Some((1, 2)))]);
        let both: Vec<ResultRecord> = base.iter().chain(&other).cloned().collect();
        let d = differences(&Check {
            sides: vec![("A", records(&run, &both))],
            rows: vec![RowGroups {
                name: "s/x → s/y".into(),
                across: Vec::new(),
                pair: vec![("A", [records(&run, &base), records(&run, &other)])],
            }],
            backend_metric: false,
        });
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].by_design && !d[0].blocking, "{d:?}");
        assert_eq!(d[0].what, "variants s/x → s/y (vCPUs at once)");
    }

    #[test]
    fn a_parallelism_warning_is_said_once_for_every_record_that_has_it() {
        let run = fixture_run();
        let a = [
            rec("a", Some((16, 2))),
            rec("a", Some((16, 2))),
            rec("a", None),
        ];
        let b = [rec("b", Some((16, 2))), rec("b", Some((2, 2)))];
        let check = Check {
            sides: vec![("A", records(&run, &a)), ("B", records(&run, &b))],
            rows: Vec::new(),
            backend_metric: false,
        };
        let w = check.parallelism_warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("16 vCPUs on 2 usable host cores: "),
            "{w:?}"
        );
        let none = Check {
            sides: vec![("B", records(&run, &b[1..]))],
            rows: Vec::new(),
            backend_metric: false,
        };
        assert!(none.parallelism_warnings().is_empty());
    }

    #[test]
    fn definitions_differ_by_field() {
        let v = |sched: Option<&str>, args: &[&str]| Variant {
            name: "v".into(),
            target: crate::record::scenario::Target {
                kind: "scsi_debug".into(),
                params: vec!["max_queue=128".into()],
            },
            stack: None,
            sched: sched.map(str::to_string),
            nr_requests: None,
            queue_depth: None,
            nomerges: None,
            rq_affinity: None,
            device: vec!["tags=none".into()],
            layout: Default::default(),
            runtime: 20,
            ramp: 0,
            fio_args: args.iter().map(|s| s.to_string()).collect(),
        };
        let (a, b) = definition_difference(
            &v(None, &["--bs=8k", "--iodepth=64"]),
            &v(Some("mq-deadline"), &["--bs=8k", "--iodepth=16"]),
        )
        .unwrap();
        assert_eq!(a, "sched=-; fio args: --iodepth=64");
        assert_eq!(b, "sched=mq-deadline; fio args: --iodepth=16");
        assert!(definition_difference(&v(None, &[]), &v(None, &[])).is_none());
        let mut stacked = v(Some("none"), &[]);
        stacked.stack = Some(crate::record::scenario::Stack {
            kind: "multipath".into(),
            params: vec!["path_sched=mq-deadline".into()],
        });
        let (a, b) = definition_difference(&stacked, &v(Some("none"), &[])).unwrap();
        assert_eq!(a, "stack=multipath,path_sched=mq-deadline");
        assert_eq!(b, "stack=-");
    }
}
