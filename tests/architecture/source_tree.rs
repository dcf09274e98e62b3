//! The compiled, non-test source files of a crate's `src/`, found the way
//! rustc finds them: from `lib.rs` (and `main.rs`) through every `mod x;`
//! declaration, to `x.rs` or `x/mod.rs` beside it. A module declared under
//! `#[cfg(test)]`, or named `tests`, is left out with everything below it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::punctuated::Punctuated;
use syn::{Attribute, Item, Meta, Token};

/// Which crate of the package a file belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Crate {
    /// The library, rooted at `lib.rs`: its module paths start at `crate`.
    Lib,
    /// The binary, rooted at `main.rs`: its root's module path is
    /// `["main"]`, and it reaches the library by the package's crate name.
    Bin,
}

/// One source file and the module it holds.
pub(crate) struct SourceFile {
    /// The path relative to `src/`'s parent, e.g. `src/lab/runner.rs`.
    pub(crate) shown: String,
    /// The module path: `["lab", "runner"]`; `[]` for `lib.rs`.
    pub(crate) module: Vec<String>,
    pub(crate) krate: Crate,
    pub(crate) syntax: syn::File,
}

impl SourceFile {
    /// The top-level name of `src/` the file is under: the first segment of
    /// its module path, `lib` for `lib.rs`.
    pub(crate) fn top(&self) -> &str {
        self.module.first().map_or("lib", String::as_str)
    }
}

/// Every non-test source file reachable from `src/lib.rs` and
/// `src/main.rs`. Panics naming the file when one cannot be read or parsed,
/// or a declared module has no file.
pub(crate) fn read(src: &Path) -> Vec<SourceFile> {
    let shown_base = src.parent().unwrap_or(Path::new(""));
    let mut files = Vec::new();
    let roots = [
        ("lib.rs", Crate::Lib, Vec::new()),
        ("main.rs", Crate::Bin, vec!["main".to_string()]),
    ];
    for (name, krate, module) in roots {
        let path = src.join(name);
        if path.exists() {
            let found = Found {
                file: path,
                children: src.to_path_buf(),
                module,
            };
            read_module(found, krate, shown_base, &mut files);
        }
    }
    files
}

/// A module's file, where the files of the modules it declares live, and
/// its module path.
struct Found {
    file: PathBuf,
    children: PathBuf,
    module: Vec<String>,
}

fn read_module(found: Found, krate: Crate, shown_base: &Path, out: &mut Vec<SourceFile>) {
    let path = &found.file;
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let syntax =
        syn::parse_file(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
    let mut children = Vec::new();
    let here = path.parent().unwrap_or(Path::new(""));
    let dirs = Dirs {
        file: here,
        children: &found.children,
    };
    declared_files(&syntax.items, dirs, &found.module, &mut children);
    out.push(SourceFile {
        shown: path
            .strip_prefix(shown_base)
            .unwrap_or(path)
            .display()
            .to_string(),
        module: found.module,
        krate,
        syntax,
    });
    for child in children {
        read_module(child, krate, shown_base, out);
    }
}

/// Where the files of a module's children live: beside it for `lib.rs`,
/// `main.rs`, `mod.rs` and a file named by `#[path]`, else in the folder
/// named after it.
fn children_dir(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
    let stem = path.file_stem().unwrap_or_default();
    if ["lib", "main", "mod"].iter().any(|s| stem == *s) {
        dir
    } else {
        dir.join(stem)
    }
}

/// The folder of the file being read (where `#[path = "…"]` is relative
/// to) and the folder of its children's files.
#[derive(Clone, Copy)]
struct Dirs<'a> {
    file: &'a Path,
    children: &'a Path,
}

/// The value of a `#[path = "…"]` attribute.
fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs
        .iter()
        .find(|a| a.path().is_ident("path"))
        .and_then(|a| {
            let syn::Meta::NameValue(nv) = &a.meta else {
                return None;
            };
            let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
            else {
                return None;
            };
            Some(s.value())
        })
}

/// The files of the non-test `mod x;` declarations among `items`, also
/// those inside inline modules (`mod a { mod b; }` is `a/b.rs`).
fn declared_files(items: &[Item], dirs: Dirs<'_>, module: &[String], out: &mut Vec<Found>) {
    for item in items {
        let Item::Mod(m) = item else { continue };
        if is_test_only(&m.attrs) || m.ident == "tests" {
            continue;
        }
        let name = m.ident.to_string();
        let mut child = module.to_vec();
        child.push(name.clone());
        if let Some((_, inner)) = &m.content {
            let nested = dirs.children.join(&name);
            let inner_dirs = Dirs {
                file: &nested,
                children: &nested,
            };
            declared_files(inner, inner_dirs, &child, out);
            continue;
        }
        let found = match path_attr(&m.attrs) {
            Some(p) => {
                let file = dirs.file.join(p);
                let children = file.parent().unwrap_or(Path::new("")).to_path_buf();
                Found {
                    file,
                    children,
                    module: child,
                }
            }
            None => {
                let flat = dirs.children.join(format!("{name}.rs"));
                let file = if flat.exists() {
                    flat
                } else {
                    dirs.children.join(&name).join("mod.rs")
                };
                Found {
                    children: children_dir(&file),
                    file,
                    module: child,
                }
            }
        };
        assert!(
            found.file.exists(),
            "module {} has no file: {}",
            found.module.join("::"),
            found.file.display()
        );
        out.push(found);
    }
}

/// Whether attributes make an item test-only: `#[cfg(test)]` or
/// `#[cfg(all(…, test, …))]` (`any(test, …)` and `not(test)` are not).
pub(crate) fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .any(|a| match a.parse_args::<Meta>() {
            Ok(Meta::Path(p)) => p.is_ident("test"),
            Ok(Meta::List(list)) if list.path.is_ident("all") => list
                .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
                .is_ok_and(|preds| {
                    preds
                        .iter()
                        .any(|m| matches!(m, Meta::Path(p) if p.is_ident("test")))
                }),
            _ => false,
        })
}

/// The module paths of the library's files.
pub(crate) fn lib_modules(files: &[SourceFile]) -> BTreeSet<Vec<String>> {
    files
        .iter()
        .filter(|f| f.krate == Crate::Lib)
        .map(|f| f.module.clone())
        .collect()
}

/// The attributes of an item, of any kind.
pub(crate) fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The attributes of an item in an `impl` block.
pub(crate) fn impl_item_attrs(item: &syn::ImplItem) -> &[Attribute] {
    match item {
        syn::ImplItem::Const(i) => &i.attrs,
        syn::ImplItem::Fn(i) => &i.attrs,
        syn::ImplItem::Type(i) => &i.attrs,
        syn::ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The attributes of an item in a trait.
pub(crate) fn trait_item_attrs(item: &syn::TraitItem) -> &[Attribute] {
    match item {
        syn::TraitItem::Const(i) => &i.attrs,
        syn::TraitItem::Fn(i) => &i.attrs,
        syn::TraitItem::Type(i) => &i.attrs,
        syn::TraitItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}
