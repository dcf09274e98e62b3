//! blklab's own instructions per request, held to a recorded budget.
//!
//! Instruction counts do not depend on how fast the machine is or what else
//! it runs (valgrind's callgrind counts them, `blklab bench
//! --instructions`), so this test can do what a timing test cannot: fail
//! when a change makes the request path more expensive. It counts the
//! release binary (the one users run; built here if `cargo test` has not),
//! one queue, 4 KiB random requests on a null disk, statistics on, as the
//! table in docs/benchmarks.md does, for a short run of each load and one
//! twice as long, and takes the difference per request.
//!
//! The margin is 10 %. What still moves between runs of the same binary is
//! how many requests each wake-up finds at QD64, and with it the share of
//! epoll, eventfd and notification work per request (seen here: 1,075 to
//! 1,204 for randwrite QD64 across runs before the statistics' cost was
//! cut by 24, 966 to 1,101 after); the request path itself
//! (`SplitRing::pop`, `Request::parse`, `serve_chain`, the statistics)
//! counts exactly the same every time. QD1 runs pause 1 ms after each
//! completion, so every request is one wake-up.
//!
//! To update a budget after a deliberate change: run
//! `cargo run --release -- bench --instructions --blklab-only` three times,
//! take the highest blklab figure of each load (reads without the zero
//! fill, which is memset's and not ours), put it in `BUDGET` below with the
//! commit, and record the table in docs/benchmarks.md ("Instructions per
//! request").

mod common;

use std::path::PathBuf;
use std::process::Command;

use blklab::bench::instructions::{self, CountedLoad, InsnOpts, Subject};
use blklab::bench::RwMode;

/// (load, budget in instructions per request, reads without the zero fill),
/// recorded on the 2-core development VM with valgrind 3.19 at c71a938
/// (statistics at 27 instructions per request at QD64, 63 at QD1; the
/// highest of four or five runs each: randwrite QD64 966–1,101, randread
/// QD64 1,055–1,139, randwrite QD1 2,365–2,378). The budgets of the
/// commit that added this test were 1,210, 1,220 and 2,480.
const BUDGET: &[(RwMode, usize, f64)] = &[
    (RwMode::Randwrite, 64, 1_110.0),
    (RwMode::Randread, 64, 1_140.0),
    (RwMode::Randwrite, 1, 2_380.0),
];
const MARGIN: f64 = 0.10;

/// The release binary of this tree, built now if needed (`cargo build`
/// does nothing when it is up to date; cargo does not hold the build lock
/// while tests run).
fn release_blklab() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--release", "--bin", "blklab"])
        .current_dir(common::root())
        .status()
        .expect("run cargo build --release");
    assert!(st.success(), "cargo build --release failed: {st}");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::root().join("target"));
    let bin = target.join("release/blklab");
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

#[test]
fn the_request_path_stays_within_its_instruction_budget() {
    instructions::valgrind_version(std::path::Path::new("valgrind"))
        .expect("valgrind (.ci/install-deps installs it)");
    let opts = InsnOpts {
        blklab_bin: release_blklab(),
        qsd_bin: None,
        valgrind: "valgrind".into(),
        requests: 2_000,
        loads: Vec::new(),
        subjects: vec![Subject::Blklab],
        top: 12,
        size: 1 << 30,
        keep_profiles: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut over = Vec::new();
    let mut table = String::new();
    for &(rw, depth, budget) in BUDGET {
        let load = CountedLoad { rw, depth };
        let c = instructions::count(&opts, Subject::Blklab, load, dir.path())
            .unwrap_or_else(|e| panic!("{}: {e}", load.name()));
        let ours = c.instructions_per_request - c.zero_fill_per_request;
        let limit = budget * (1.0 + MARGIN);
        table += &format!(
            "{:<20} {ours:>7.0} (budget {budget:.0}, limit {limit:.0}; statistics {:.0})\n",
            load.name(),
            c.statistics_per_request
        );
        // The count must be a real one: a request costs hundreds of
        // instructions, never nothing.
        assert!(
            ours > 300.0,
            "{}: {ours} instructions per request is not a count",
            load.name()
        );
        if ours > limit {
            let top: Vec<String> = c
                .top
                .iter()
                .map(|(f, n)| format!("  {n:>8.1}  {f}"))
                .collect();
            over.push(format!(
                "{}: {ours:.0} > {limit:.0}\n{}",
                load.name(),
                top.join("\n")
            ));
        }
    }
    eprintln!("{table}");
    assert!(
        over.is_empty(),
        "over the instruction budget (see this file's header to update it):\n{}\n\n{table}",
        over.join("\n\n")
    );
}
