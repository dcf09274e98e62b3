//! Plain-text table helpers shared by the lab summary and the report.

/// Lines of an aligned plain-text table: each column as wide as its widest
/// cell, two blanks between columns, left-aligned where `left(row,
/// column)` says so, right-aligned elsewhere; trailing blanks trimmed.
/// Also returns the column widths.
pub(crate) fn aligned_lines(
    cells: &[Vec<String>],
    left: impl Fn(&[String], usize) -> bool,
) -> (Vec<String>, Vec<usize>) {
    let ncols = cells.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncols)
        .map(|i| {
            cells
                .iter()
                .filter_map(|l| l.get(i).map(|c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let lines = cells
        .iter()
        .map(|l| {
            l.iter()
                .enumerate()
                .map(|(i, c)| {
                    if left(l, i) {
                        format!("{c:<w$}", w = widths[i])
                    } else {
                        format!("{c:>w$}", w = widths[i])
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        })
        .collect();
    (lines, widths)
}

/// `text` in lines of at most `width` characters (a longer word stands
/// alone), each after `indent`.
pub(crate) fn wrap(text: &str, width: usize, indent: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(format!("{indent}{line}"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(format!("{indent}{line}"));
    }
    lines
}

/// Numbers with a precision that suits their size.
pub(crate) fn num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_keeps_words_whole_and_lines_short() {
        let w = wrap("aa bb cc ddddddddd e", 5, "> ");
        assert_eq!(w, ["> aa bb", "> cc", "> ddddddddd", "> e"]);
        assert!(wrap("", 5, "").is_empty());
    }
}
