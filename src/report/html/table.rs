//! The report page's tables: real `<table>`s whose number cells are
//! right-aligned and carry their exact value in `data-v` (what the page's
//! sorting reads, and what a test of the page compares with report.json),
//! whose headers say which side a column is of (by colour and in words),
//! sortable by any column when marked so. A table renders itself as
//! markup ([`Render`]), so a section's template places it as `(table)`.

use maud::{html, Markup, Render};

use crate::util::text::num;

/// Which side a column is of (its colour on the page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tint {
    None,
    A,
    B,
    /// With two kernels and pairs: A's other variant, B's other variant.
    A2,
    B2,
}

impl Tint {
    fn class(self) -> &'static str {
        match self {
            Tint::None => "",
            Tint::A => " a",
            Tint::B => " b",
            Tint::A2 => " a2",
            Tint::B2 => " b2",
        }
    }
}

/// A column: its heading (units in it), side, and whether it holds numbers.
#[derive(Debug, Clone)]
pub(crate) struct Col {
    head: String,
    tint: Tint,
    numeric: bool,
    /// Long text: lines wrap.
    wrap: bool,
}

impl Col {
    /// A text column.
    pub(crate) fn text(head: impl Into<String>) -> Col {
        Col {
            head: head.into(),
            tint: Tint::None,
            numeric: false,
            wrap: false,
        }
    }

    /// A number column.
    pub(crate) fn num(head: impl Into<String>) -> Col {
        Col {
            head: head.into(),
            tint: Tint::None,
            numeric: true,
            wrap: false,
        }
    }

    pub(crate) fn tint(mut self, t: Tint) -> Col {
        self.tint = t;
        self
    }

    /// Long text whose lines wrap.
    pub(crate) fn wrap(mut self) -> Col {
        self.wrap = true;
        self
    }
}

/// A cell: text, or a number shown rounded with its exact value kept.
#[derive(Debug, Clone)]
pub(crate) enum Cell {
    Text(String),
    /// (value, as shown); not finite: shown as `-`, without a value.
    Num(f64, String),
}

impl Cell {
    pub(crate) fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }

    /// A number at a precision that suits its size.
    pub(crate) fn num(v: f64) -> Cell {
        Cell::Num(v, num(v))
    }

    /// A count.
    pub(crate) fn count(n: usize) -> Cell {
        Cell::Num(n as f64, n.to_string())
    }

    /// A percentage (of 100), signed.
    pub(crate) fn pct(v: f64) -> Cell {
        Cell::Num(v, format!("{v:+.1}"))
    }

    /// A percentage (of 100), unsigned.
    pub(crate) fn pct_plain(v: f64) -> Cell {
        Cell::Num(v, format!("{v:.1}"))
    }

    /// A value that may be missing.
    pub(crate) fn opt(v: Option<f64>, f: fn(f64) -> Cell) -> Cell {
        v.map_or(Cell::text("-"), f)
    }

    /// A p-value.
    pub(crate) fn p(v: Option<f64>) -> Cell {
        match v {
            Some(p) if p < 1e-4 => Cell::Num(p, format!("{p:.1e}")),
            Some(p) => Cell::Num(p, format!("{p:.4}")),
            None => Cell::text("-"),
        }
    }

    /// The cell as a `<td>`, styled as its column.
    fn td(&self, col: Option<&Col>) -> Markup {
        let tint = col.map_or("", |c| c.tint.class());
        let wrap = if col.is_some_and(|c| c.wrap) {
            " wrap"
        } else {
            ""
        };
        match self {
            Cell::Text(t) => html! { td class={ "t" (tint) (wrap) } { (t) } },
            Cell::Num(v, shown) if v.is_finite() => {
                html! { td class={ "n" (tint) } data-v=(v) { (shown) } }
            }
            Cell::Num(..) => html! { td class={ "n" (tint) } { "-" } },
        }
    }
}

/// A table being built.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    id: String,
    caption: Option<String>,
    cols: Vec<Col>,
    rows: Vec<(Vec<Cell>, Option<&'static str>)>,
    foot: Vec<Vec<Cell>>,
    sortable: bool,
}

impl Table {
    /// A sortable table with element id `id` (made safe for a URL).
    pub(crate) fn new(id: &str, cols: Vec<Col>) -> Table {
        Table {
            id: anchor(id),
            caption: None,
            cols,
            rows: Vec::new(),
            foot: Vec::new(),
            sortable: true,
        }
    }

    /// A table of facts, in the order given: not sortable.
    pub(crate) fn facts(id: &str, cols: Vec<Col>) -> Table {
        Table {
            sortable: false,
            ..Table::new(id, cols)
        }
    }

    pub(crate) fn caption(mut self, c: impl Into<String>) -> Table {
        self.caption = Some(c.into());
        self
    }

    pub(crate) fn row(&mut self, cells: Vec<Cell>) {
        self.rows.push((cells, None));
    }

    /// A row with a class (e.g. `sig` for a significant one).
    pub(crate) fn row_class(&mut self, cells: Vec<Cell>, class: Option<&'static str>) {
        self.rows.push((cells, class));
    }

    /// A row after the body that sorting leaves where it is.
    pub(crate) fn foot(&mut self, cells: Vec<Cell>) {
        self.foot.push(cells);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl Render for Table {
    fn render(&self) -> Markup {
        let cells = |cells: &[Cell]| -> Markup {
            html! { @for (i, cell) in cells.iter().enumerate() { (cell.td(self.cols.get(i))) } }
        };
        html! {
            table id=(self.id) class=[self.sortable.then_some("sortable")] {
                @if let Some(c) = &self.caption { caption { (c) } }
                thead {
                    tr {
                        @for c in &self.cols {
                            th scope="col" class={ (if c.numeric { "n" } else { "t" }) (c.tint.class()) } {
                                (c.head)
                            }
                        }
                    }
                }
                tbody {
                    @for (row, class) in &self.rows {
                        tr class=[*class] { (cells(row)) }
                    }
                }
                @if !self.foot.is_empty() {
                    tfoot { @for row in &self.foot { tr { (cells(row)) } } }
                }
            }
        }
    }
}

/// `s` as an element id: letters, digits, `-`, `_` and `.`; anything else
/// `_`.
pub(crate) fn anchor(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_their_exact_value_and_text_is_escaped() {
        let mut t = Table::new(
            "m/1",
            vec![Col::text("row"), Col::num("A (µs)").tint(Tint::A)],
        );
        t.row(vec![Cell::text("a<b"), Cell::num(1234.5678)]);
        t.row(vec![Cell::text("nan"), Cell::num(f64::NAN)]);
        let h = t.render().into_string();
        assert!(
            h.starts_with("<table id=\"m_1\" class=\"sortable\">"),
            "{h}"
        );
        assert!(
            h.contains("<th scope=\"col\" class=\"n a\">A (µs)</th>"),
            "{h}"
        );
        assert!(h.contains("<td class=\"t\">a&lt;b</td>"), "{h}");
        assert!(
            h.contains("<td class=\"n a\" data-v=\"1234.5678\">1235</td>"),
            "{h}"
        );
        assert!(h.contains("<td class=\"n a\">-</td>"), "{h}");
        assert!(!Table::facts("f", vec![])
            .render()
            .into_string()
            .contains("sortable"));
    }

    #[test]
    fn p_values_and_percentages_read_as_such() {
        let text = |c: Cell| match c {
            Cell::Num(_, s) => s,
            _ => panic!(),
        };
        assert_eq!(text(Cell::p(Some(0.0123))), "0.0123");
        assert_eq!(text(Cell::p(Some(2.5e-7))), "2.5e-7");
        assert_eq!(text(Cell::pct(2.345)), "+2.3");
        assert_eq!(text(Cell::count(7)), "7");
    }
}
