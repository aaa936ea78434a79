//! Output for people and for scripts: an aligned table and JSON.
//!
//! Human output goes to stdout in columns (numbers right-aligned, text left);
//! JSON output is one pretty-printed document whose field names are part of the
//! interface scripts rely on. A closed stdout (`blobdrive list | head -1`) is
//! not an error: writes stop quietly instead of panicking.

use std::io::{self, Write};

use serde::Serialize;

/// How a column lines up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers and sizes.
    Right,
}

/// A table printed with aligned columns, headers in upper case.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            headers: columns.iter().map(|(h, _)| h.to_uppercase()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row; missing cells are empty, extra cells are dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut row: Vec<String> = cells.into_iter().map(Into::into).collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// True when no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row, columns two spaces apart, no
    /// trailing spaces.
    pub fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain(std::iter::once(self.headers[i].chars().count()))
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(self.rows.iter()) {
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(i, cell)| match self.align[i] {
                    Align::Left => format!("{cell:<w$}", w = widths[i]),
                    Align::Right => format!("{cell:>w$}", w = widths[i]),
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out
    }

    /// Print the table to stdout.
    pub fn print(&self) {
        print_text(&self.render());
    }
}

/// `value` as pretty JSON followed by a newline.
pub fn to_json<T: Serialize>(value: &T) -> String {
    match serde_json::to_string_pretty(value) {
        Ok(mut s) => {
            s.push('\n');
            s
        }
        // Our output types are plain structs of strings and numbers; serde_json
        // fails only on maps with non-string keys, which they never contain.
        Err(e) => format!("{{\"error\": {:?}}}\n", e.to_string()),
    }
}

/// Print `value` as JSON to stdout.
pub fn print_json<T: Serialize>(value: &T) {
    print_text(&to_json(value));
}

/// Write text to stdout; a closed pipe ends the output quietly.
pub fn print_text(text: &str) {
    let mut out = io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        tracing::debug!("stdout closed; output dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_with_numbers_on_the_right() {
        let mut t = Table::new(&[
            ("name", Align::Left),
            ("size", Align::Right),
            ("lease", Align::Left),
        ]);
        t.row(["data/disk1.vhd", "10.0 GiB", "available"]);
        t.row(["d/x", "512.0 MiB", ""]);
        assert_eq!(
            t.render(),
            "NAME                 SIZE  LEASE\n\
             data/disk1.vhd   10.0 GiB  available\n\
             d/x             512.0 MiB\n"
        );
    }

    #[test]
    fn short_rows_are_padded() {
        let mut t = Table::new(&[("a", Align::Left), ("b", Align::Right)]);
        t.row(["x"]);
        assert_eq!(t.render(), "A  B\nx\n");
        assert!(!t.is_empty());
    }

    #[test]
    fn json_is_pretty_with_a_newline() {
        #[derive(Serialize)]
        struct Drive {
            name: &'static str,
            size_bytes: u64,
        }
        let s = to_json(&Drive {
            name: "c/d",
            size_bytes: 512,
        });
        assert_eq!(s, "{\n  \"name\": \"c/d\",\n  \"size_bytes\": 512\n}\n");
    }
}
