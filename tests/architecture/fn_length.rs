//! The length of every non-test function and method of a source tree:
//! from the line of its `fn` to the line of its closing brace, both
//! counted. Functions inside functions are counted on their own too.

use std::path::Path;

use proc_macro2::Span;
use syn::visit::{self, Visit};
use syn::{Block, ImplItem, Item, ItemFn, ItemMod, TraitItem};

use crate::source_tree::{self, impl_item_attrs, is_test_only, item_attrs, trait_item_attrs};

/// A function and its length in lines.
#[derive(Debug)]
pub(crate) struct FnLength {
    /// `src/…/file.rs`.
    pub(crate) file: String,
    /// The last segment of the file's module path (`scenario` for
    /// `src/lab/scenario.rs`), `lib`/`main` for the crate roots.
    pub(crate) module: String,
    pub(crate) name: String,
    /// The line of its `fn`.
    pub(crate) line: usize,
    pub(crate) lines: usize,
}

/// Every non-test function of the crate in `src` (`#[cfg(test)]` items and
/// `mod tests` left out).
pub(crate) fn functions(src: &Path) -> Vec<FnLength> {
    let mut out = Vec::new();
    for file in source_tree::read(src) {
        let mut lengths = Lengths {
            file: &file.shown,
            module: file.module.last().map_or(file.top(), String::as_str),
            out: &mut out,
        };
        lengths.visit_file(&file.syntax);
    }
    out
}

struct Lengths<'a> {
    file: &'a str,
    module: &'a str,
    out: &'a mut Vec<FnLength>,
}

impl Lengths<'_> {
    fn record(&mut self, name: &syn::Ident, fn_token: Span, body: &Block) {
        let first = fn_token.start().line;
        let last = body.brace_token.span.close().end().line;
        self.out.push(FnLength {
            file: self.file.to_string(),
            module: self.module.to_string(),
            name: name.to_string(),
            line: first,
            lines: last + 1 - first,
        });
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
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
        if m.ident != "tests" {
            visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast ItemFn) {
        self.record(&f.sig.ident, f.sig.fn_token.span, &f.block);
        visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(&f.sig.ident, f.sig.fn_token.span, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.record(&f.sig.ident, f.sig.fn_token.span, body);
        }
        visit::visit_trait_item_fn(self, f);
    }
}
