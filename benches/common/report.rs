//! Printing shared by the examples' tables: `--help` from an options
//! table, the reps' range, and the one-line verdict per mode.
#![allow(dead_code)] // each includer uses part of it

use super::machine::hmean;
use std::fmt::Write as _;

/// `--help`: `about`, the usage line of `example`, and every row of
/// `options` (the option and its value, what it does, its default).
pub fn help_text(about: &str, example: &str, options: &[(&str, &str, &str)]) -> String {
    let mut s = format!(
        "{about}\n\nusage: cargo run --release --example {example} -- [OPTIONS]\n\noptions:\n"
    );
    for (opt, what, default) in options {
        let _ = writeln!(s, "  {opt}");
        wrap(&mut s, what);
        if !default.is_empty() {
            wrap(&mut s, &format!("default: {default}"));
        }
    }
    s
}

/// Appends `text` to `s` in lines of at most 80 columns, indented by 6.
fn wrap(s: &mut String, text: &str) {
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && 6 + line.len() + 1 + word.len() > 80 {
            let _ = writeln!(s, "      {line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    let _ = writeln!(s, "      {line}");
}

/// A bad command line: `help` on stderr after a line naming `example`,
/// exit status 2.
pub fn usage(example: &str, help: &str) -> ! {
    eprint!("{example}: an unknown option or a bad value\n\n{help}");
    std::process::exit(2)
}

/// The smallest and largest of `xs`.
pub fn range(xs: &[f64]) -> (f64, f64) {
    let lo = xs.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// One line per mode (`modes`, baseline first): how its rate compares
/// with every mode before it at each thread count (the ratio of harmonic
/// means of `rates(thread-count index, mode index)`, one rate per rep, and
/// at how many counts the reps' ranges are apart), and how it scales from
/// the first thread count to the last.
pub fn verdicts(
    modes: &[String],
    threads: &[usize],
    rates: impl Fn(usize, usize) -> Vec<f64>,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (m, mode) in modes.iter().enumerate() {
        let mut parts = Vec::new();
        if m == 0 {
            parts.push("the baseline".to_string());
        }
        for base in modes.iter().take(m).enumerate() {
            let (b, base) = base;
            let mut ratios = Vec::new();
            let mut apart = 0;
            for ti in 0..threads.len() {
                let (x, y) = (rates(ti, m), rates(ti, b));
                ratios.push(hmean(&x) / hmean(&y));
                let ((xlo, xhi), (ylo, yhi)) = (range(&x), range(&y));
                apart += usize::from(xlo > yhi || xhi < ylo);
            }
            // Within 3% counts as level: below the run-to-run noise here.
            let word = if ratios.iter().all(|&r| r > 1.03) {
                "faster than"
            } else if ratios.iter().all(|&r| r < 0.97) {
                "slower than"
            } else if ratios.iter().all(|&r| (0.97..=1.03).contains(&r)) {
                "level with"
            } else {
                "mixed against"
            };
            let each = threads
                .iter()
                .zip(&ratios)
                .map(|(t, r)| format!("{r:.2}x at {t}"))
                .collect::<Vec<_>>()
                .join(", ");
            parts.push(format!(
                "{word} {base} ({each} thread{}; ranges apart at {apart} of {})",
                if threads == [1] { "" } else { "s" },
                threads.len()
            ));
        }
        if let (Some(first), Some(last)) = (threads.first(), threads.last()) {
            if last > first {
                let (i, j) = (0, threads.len() - 1);
                let scale = hmean(&rates(j, m)) / hmean(&rates(i, m));
                parts.push(format!("scales {scale:.2}x from {first} to {last} threads"));
            }
        }
        lines.push(format!(
            "verdict {:<12} {}",
            format!("{mode}:"),
            parts.join("; ")
        ));
    }
    lines
}
