//! The check over a source directory: files import only from their own
//! layer or those below it, and no files import each other in a loop.
//!
//! A layer is a set of top-level names of `src/` (folders or files; `lib`
//! for `lib.rs`, `main` for `main.rs`). A file's import of a module above
//! it in its own folder tree (`crate::device` from `device/tags.rs`) is the
//! folder's face, not an edge between files.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;

use crate::imports::imports;
use crate::source_tree::{self, lib_modules};

/// What the check found; all empty when the tree keeps the rules.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Top-level names of `src/` in no layer.
    pub(crate) unlayered: BTreeSet<String>,
    /// Imports from a lower layer of a higher one, one per pair of files.
    pub(crate) upward: Vec<String>,
    /// Loops of files, each a path of files back to its first.
    pub(crate) cycles: Vec<Cycle>,
}

impl Findings {
    pub(crate) fn is_clean(&self) -> bool {
        self.unlayered.is_empty() && self.upward.is_empty() && self.cycles.is_empty()
    }
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for name in &self.unlayered {
            writeln!(
                f,
                "src/{name} is in no layer: add it to the layers and docs/ARCHITECTURE.md"
            )?;
        }
        if !self.upward.is_empty() {
            writeln!(f, "imports that point upward:")?;
            for u in &self.upward {
                writeln!(f, "  {u}")?;
            }
        }
        if !self.cycles.is_empty() {
            writeln!(f, "import cycles:")?;
            for c in &self.cycles {
                writeln!(f, "  {c}")?;
            }
        }
        Ok(())
    }
}

/// One step of a cycle: a file, and where it imports the next one.
#[derive(Debug, Clone)]
pub(crate) struct Hop {
    pub(crate) file: String,
    pub(crate) line: usize,
    pub(crate) written: String,
}

/// Files importing each other in a loop, in order; the last imports the first.
#[derive(Debug)]
pub(crate) struct Cycle(pub(crate) Vec<Hop>);

impl Cycle {
    pub(crate) fn files(&self) -> Vec<&str> {
        self.0.iter().map(|h| h.file.as_str()).collect()
    }
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for h in &self.0 {
            write!(f, "{} (line {}: {}) -> ", h.file, h.line, h.written)?;
        }
        write!(f, "{}", self.0.first().map_or("", |h| h.file.as_str()))
    }
}

/// Checks the crate in `src` (its library named `crate_name`) against
/// `layers`, bottom first: a file in layer N may import layers 0..=N.
pub(crate) fn check(src: &Path, crate_name: &str, layers: &[&[&str]]) -> Findings {
    let files = source_tree::read(src);
    let modules = lib_modules(&files);
    let shown: BTreeMap<&[String], &str> = files
        .iter()
        .map(|f| (f.module.as_slice(), f.shown.as_str()))
        .collect();
    let layer_of = |top: &str| layers.iter().position(|l| l.contains(&top));
    let mut findings = Findings::default();
    // file → imported file → where (the first place it is written).
    let mut graph: BTreeMap<String, BTreeMap<String, (usize, String)>> = BTreeMap::new();
    for file in &files {
        let edges = graph.entry(file.shown.clone()).or_default();
        let Some(mine) = layer_of(file.top()) else {
            findings.unlayered.insert(file.top().to_string());
            continue;
        };
        for import in imports(file, &modules, crate_name) {
            if file.krate == source_tree::Crate::Lib && file.module.starts_with(&import.target) {
                continue;
            }
            let Some(target) = shown.get(import.target.as_slice()) else {
                continue;
            };
            let top = import.target.first().map_or("lib", String::as_str);
            match layer_of(top) {
                None => {
                    findings.unlayered.insert(top.to_string());
                }
                Some(theirs) if theirs > mine && !edges.contains_key(*target) => {
                    findings.upward.push(format!(
                        "{}:{} (layer {mine}) imports {} (layer {theirs}): {}",
                        file.shown, import.line, target, import.written
                    ));
                }
                Some(_) => {}
            }
            edges
                .entry(target.to_string())
                .or_insert((import.line, import.written));
        }
    }
    findings.cycles = cycles(&graph);
    findings
}

type Graph = BTreeMap<String, BTreeMap<String, (usize, String)>>;

/// For each file on a loop, a shortest loop through it; a loop found
/// again from another of its files is listed once.
fn cycles(graph: &Graph) -> Vec<Cycle> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for start in graph.keys() {
        let Some(files) = shortest_cycle(graph, start) else {
            continue;
        };
        // The same loop found from another of its files: rotate to its least.
        let least = files
            .iter()
            .enumerate()
            .min_by_key(|(_, f)| *f)
            .map_or(0, |(i, _)| i);
        let mut key = files.clone();
        key.rotate_left(least);
        if !seen.insert(key.clone()) {
            continue;
        }
        let hops = key
            .iter()
            .zip(key.iter().cycle().skip(1))
            .map(|(from, to)| {
                let (line, written) = graph[from][to].clone();
                Hop {
                    file: from.clone(),
                    line,
                    written,
                }
            })
            .collect();
        out.push(Cycle(hops));
    }
    out
}

/// The files of a shortest path from `start` back to itself (breadth
/// first), `start` first.
fn shortest_cycle(graph: &Graph, start: &str) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if next == start {
                let mut files = vec![node.to_string()];
                let mut at = node;
                while at != start {
                    at = came_from[at];
                    files.push(at.to_string());
                }
                files.reverse();
                return Some(files);
            }
            if next != start && !came_from.contains_key(next.as_str()) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    None
}
