//! Markdown tables and number formatting for the report.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// A Markdown table with aligned columns.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(ToString::to_string).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, w) in widths.iter().enumerate().take(columns) {
                let cell = cells.get(i).map_or("", String::as_str);
                let pad = w - cell.chars().count();
                // Numbers right-aligned, words left-aligned.
                if i > 0 && cell.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '≤')
                {
                    let _ = write!(s, " {}{cell} |", " ".repeat(pad));
                } else {
                    let _ = write!(s, " {cell}{} |", " ".repeat(pad));
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.header);
        out.push('|');
        for w in &widths {
            out.push_str(&"-".repeat(w + 2));
            out.push('|');
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// A count with thousands separators: 12,345.
pub fn count(x: f64) -> String {
    if x.is_nan() {
        return "n/a".into();
    }
    let n = x.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

/// A ratio: 0.93×.
pub fn ratio(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else if x >= 10.0 {
        format!("{x:.0}×")
    } else {
        format!("{x:.2}×")
    }
}

/// Milliseconds with a precision that suits their size.
pub fn millis(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else if x.abs() < 10.0 {
        format!("{x:.2} ms")
    } else if x.abs() < 100.0 {
        format!("{x:.1} ms")
    } else {
        format!("{x:.0} ms")
    }
}

/// A plain number with `digits` decimals.
pub fn num(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.digits$}")
    }
}

/// A share as a percentage.
pub fn percent(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{:.1}%", x * 100.0)
    }
}

/// A target verdict.
pub fn verdict(met: Option<bool>) -> String {
    match met {
        Some(true) => "met".into(),
        Some(false) => "**missed**".into(),
        None => "n/a".into(),
    }
}

/// Now, as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3_600,
        rest % 3_600 / 60
    )
}
