//! What one file imports: every path it writes that names a module of the
//! library, resolved to the file that holds that module.
//!
//! Read: every `use` tree (grouped, nested, `self`, renames, globs, `pub
//! use`), and every path of two or more segments in code (expressions,
//! types, patterns, trait bounds, attributes) and, token by token, in macro
//! invocations and `macro_rules!` bodies. A path starts at `crate::`, the
//! package's crate name, `self::`, `super::…`, a module declared in the
//! current module, or a name a `use` brought into it (so `use
//! crate::lab::nested;` then `nested::host::boot()` reaches `host.rs`). A
//! path into an item of module m counts as an import of m's file.
//! `#[cfg(test)]` items and `mod tests` are not read.

use std::collections::{BTreeSet, HashMap};

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{ImplItem, Item, ItemMod, ItemUse, TraitItem, UseTree};

use crate::source_tree::{impl_item_attrs, is_test_only, item_attrs, trait_item_attrs};
use crate::source_tree::{Crate, SourceFile};

/// One path of a file that names a module of the library.
pub(crate) struct Import {
    /// The line it is written on.
    pub(crate) line: usize,
    /// The path as written, e.g. `nested::host::boot`.
    pub(crate) written: String,
    /// The module path of the file it reaches.
    pub(crate) target: Vec<String>,
}

/// Every import of `file`; `modules` are the library's file modules,
/// `crate_name` the package's library name.
pub(crate) fn imports(
    file: &SourceFile,
    modules: &BTreeSet<Vec<String>>,
    crate_name: &str,
) -> Vec<Import> {
    let mut collector = Collector {
        scope: file.module.clone(),
        ..Collector::default()
    };
    collector.visit_file(&file.syntax);
    let resolver = Resolver {
        krate: file.krate,
        crate_name,
        modules,
        inline: &collector.inline,
        aliases: &collector.aliases,
    };
    collector
        .written
        .iter()
        .filter_map(|w| {
            let path = resolver.resolve(&w.scope, &w.segments, 0)?;
            let target = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|prefix| modules.contains(prefix))?;
            Some(Import {
                line: w.line,
                written: w.segments.join("::"),
                target,
            })
        })
        .collect()
}

/// A path as written, in the module it is written in.
struct Written {
    scope: Vec<String>,
    segments: Vec<String>,
    line: usize,
}

/// The syntax visitor: the paths, the names `use` brings into each module
/// and the inline modules.
#[derive(Default)]
struct Collector {
    /// The module being read (a file's module, then inline modules).
    scope: Vec<String>,
    written: Vec<Written>,
    /// (module, name) → the path the name stands for, as written there.
    aliases: HashMap<(Vec<String>, String), Vec<String>>,
    inline: BTreeSet<Vec<String>>,
}

fn line(span: Span) -> usize {
    span.start().line
}

impl Collector {
    fn push(&mut self, segments: Vec<String>, line: usize) {
        self.written.push(Written {
            scope: self.scope.clone(),
            segments,
            line,
        });
    }

    /// The leaves of a `use` tree below `prefix`: each a path, and the
    /// name it brings in unless it is a glob or `_`.
    fn use_tree(&mut self, tree: &UseTree, prefix: &mut Vec<String>) {
        let (path, name, span) = match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
                return;
            }
            UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix);
                }
                return;
            }
            UseTree::Name(n) if n.ident == "self" => {
                (prefix.clone(), prefix.last().cloned(), n.ident.span())
            }
            UseTree::Name(n) => {
                let name = n.ident.to_string();
                let path = [prefix.as_slice(), std::slice::from_ref(&name)].concat();
                (path, Some(name), n.ident.span())
            }
            UseTree::Rename(r) => {
                let path = if r.ident == "self" {
                    prefix.clone()
                } else {
                    [prefix.as_slice(), &[r.ident.to_string()]].concat()
                };
                let name = Some(r.rename.to_string()).filter(|n| n != "_");
                (path, name, r.ident.span())
            }
            UseTree::Glob(g) => (prefix.clone(), None, g.star_token.span),
        };
        if let Some(name) = name {
            self.aliases
                .insert((self.scope.clone(), name), path.clone());
        }
        self.push(path, line(span));
    }

    /// Paths in a macro's tokens: `a::b::c` runs, in every group.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(first) => {
                    let mut segments = vec![first.to_string()];
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (trees.get(i + 1), trees.get(i + 2), trees.get(i + 3))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(next.to_string());
                        i += 3;
                    }
                    if segments.len() > 1 {
                        self.push(segments, line(first.span()));
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast Item) {
        if !is_test_only(item_attrs(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        if !is_test_only(impl_item_attrs(item)) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        if !is_test_only(trait_item_attrs(item)) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast ItemMod) {
        // `mod x;` is a declaration, not an import; `mod tests` is tests.
        let Some((_, items)) = &m.content else { return };
        if m.ident == "tests" {
            return;
        }
        self.scope.push(m.ident.to_string());
        self.inline.insert(self.scope.clone());
        for item in items {
            self.visit_item(item);
        }
        self.scope.pop();
    }

    fn visit_item_use(&mut self, u: &'ast ItemUse) {
        // `use ::x` names an outside crate.
        if u.leading_colon.is_none() {
            self.use_tree(&u.tree, &mut Vec::new());
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.push(segments, line(path.segments[0].ident.span()));
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_macro(self, mac);
        self.tokens(mac.tokens.clone());
    }
}

/// Turns a path written in a module into the absolute module path it
/// names, if it names one of the library's.
struct Resolver<'a> {
    krate: Crate,
    crate_name: &'a str,
    modules: &'a BTreeSet<Vec<String>>,
    inline: &'a BTreeSet<Vec<String>>,
    aliases: &'a HashMap<(Vec<String>, String), Vec<String>>,
}

impl Resolver<'_> {
    /// Names brought in by `use` may stand for other such names; this deep
    /// is a loop, not code.
    const MAX_ALIAS_DEPTH: usize = 8;

    fn resolve(&self, scope: &[String], segments: &[String], depth: usize) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let absolute = match first.as_str() {
            // In the binary, `crate` is the binary itself.
            "crate" if self.krate == Crate::Lib => rest.to_vec(),
            "crate" => return None,
            name if name == self.crate_name => rest.to_vec(),
            "self" => [scope, rest].concat(),
            "super" => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let base = scope.get(..scope.len().checked_sub(supers)?)?;
                [base, &segments[supers..]].concat()
            }
            name => {
                let key = (scope.to_vec(), name.to_string());
                if let Some(alias) = self.aliases.get(&key) {
                    if depth >= Self::MAX_ALIAS_DEPTH {
                        return None;
                    }
                    return self.resolve(scope, &[alias.as_slice(), rest].concat(), depth + 1);
                }
                let child = [scope, &[name.to_string()]].concat();
                if self.krate == Crate::Lib
                    && (self.modules.contains(&child) || self.inline.contains(&child))
                {
                    [scope, segments].concat()
                } else {
                    // An outside crate, a local item or a generic parameter.
                    return None;
                }
            }
        };
        Some(absolute)
    }
}
