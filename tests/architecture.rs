//! The folder tree is the architecture: each layer of `src/` imports only
//! from the layers below it, and no files import each other in a loop.
//! Read from the `use crate::…` and `crate::…` paths of every source file
//! (docs/ARCHITECTURE.md names the layers; `src/lib.rs` lists them in
//! order).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first. A file in layer N may use layers 0..=N (its
/// own layer only without a cycle).
const LAYERS: &[&[&str]] = &[
    &["util"],
    &["virtq"],
    &["virtio_blk"],
    &["device"],
    &["stats"],
    &["backend"],
    &["record"],
    &["lab"],
    &["report"],
    &["bisect"],
    &["bench"],
    &["cli", "stats_view", "fuzz", "main", "lib"],
];

fn layer_of(top: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&top))
        .unwrap_or_else(|| {
            panic!("src/{top} is in no layer: add it to LAYERS and docs/ARCHITECTURE.md")
        })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` -> ["a", "b"]; `src/a/mod.rs` -> ["a"].
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut v: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if v.last().is_some_and(|l| l == "mod") {
        v.pop();
    }
    v
}

/// The code of a file without its `#[cfg(test)] mod …` (the last item of
/// a file here; tests may reach anything) and comments (no imports).
fn code(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b…` (or `super::…`, resolved against `me`) path a file
/// names, as the longest module path that exists.
fn imports(text: &str, me: &[String], modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let parent = me[..me.len().saturating_sub(1)].join("::");
    let code = code(text).replace(
        "super::",
        &if parent.is_empty() {
            "crate::".to_string()
        } else {
            format!("crate::{parent}::")
        },
    );
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let path: Vec<String> = after
            .split("::")
            .map(|seg| {
                seg.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|s| !s.is_empty())
            .collect();
        let mut best = None;
        for n in (1..=path.len()).rev() {
            if modules.contains(&path[..n].to_vec()) {
                best = Some(path[..n].to_vec());
                break;
            }
        }
        if let Some(b) = best {
            out.insert(b);
        }
        rest = after;
    }
    out
}

#[test]
fn layers_import_only_downward_and_files_form_no_cycle() {
    let src = common::root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(&src, f)).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut upward = Vec::new();
    for f in &files {
        let me = module_path(&src, f);
        let my_layer = layer_of(me.first().map_or("lib", String::as_str));
        let text = std::fs::read_to_string(f).unwrap();
        let mut deps = BTreeSet::new();
        for dep in imports(&text, &me, &modules) {
            // A parent module (`crate::device` from `device/tags.rs`) is the
            // folder's face, not an import of its own.
            if dep.is_empty() || me.starts_with(&dep) {
                continue;
            }
            let their_layer = layer_of(&dep[0]);
            if their_layer > my_layer {
                upward.push(format!(
                    "src/{} (layer {my_layer}) imports crate::{} (layer {their_layer})",
                    me.join("/"),
                    dep.join("::")
                ));
            }
            deps.insert(dep);
        }
        graph.insert(me, deps);
    }
    assert!(
        upward.is_empty(),
        "imports that point upward:\n{}",
        upward.join("\n")
    );

    // No cycle among files: depth-first search with colours.
    fn visit(
        n: &Vec<String>,
        g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
        cycles: &mut Vec<String>,
    ) {
        match state.get(n) {
            Some(2) => return,
            Some(1) => {
                let start = stack.iter().position(|x| x == n).unwrap();
                let names: Vec<String> = stack[start..]
                    .iter()
                    .chain(std::iter::once(n))
                    .map(|m| m.join("::"))
                    .collect();
                cycles.push(names.join(" -> "));
                return;
            }
            _ => {}
        }
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for d in g.get(n).into_iter().flatten() {
            visit(d, g, state, stack, cycles);
        }
        stack.pop();
        state.insert(n.clone(), 2);
    }
    let mut state = BTreeMap::new();
    let mut cycles = Vec::new();
    for n in graph.keys() {
        visit(n, &graph, &mut state, &mut Vec::new(), &mut cycles);
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_checker_sees_imports_and_ignores_tests_and_comments() {
    let modules: BTreeSet<Vec<String>> = [vec!["a".to_string()], vec!["a".into(), "b".into()]]
        .into_iter()
        .collect();
    let found = imports(
        "use crate::a::b::{X, Y};\nfn f() { crate::a::g(); } // crate::zzz\n#[cfg(test)]\nmod t { use crate::a::c; }",
        &["z".to_string()],
        &modules,
    );
    assert_eq!(
        found,
        [vec!["a".to_string(), "b".into()], vec!["a".into()]]
            .into_iter()
            .collect()
    );
    // `super::` from a/c.rs is crate::a.
    let found = imports("use super::b::X;", &["a".to_string(), "c".into()], &modules);
    assert_eq!(
        found,
        [vec!["a".to_string(), "b".into()]].into_iter().collect()
    );
}
