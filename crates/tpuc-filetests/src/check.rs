//! `CHECK` lines, matched against a printed module in the manner of LLVM's FileCheck, with
//! plain text patterns (no regular expressions: the printed IR names values by number, and a
//! case that needs more than text says so in its own lines).
//!
//! - `CHECK: p`: `p` occurs after the previous match.
//! - `CHECK-NEXT: p`: `p` occurs on the line after the previous match's line.
//! - `CHECK-SAME: p`: `p` occurs on the previous match's line, after it.
//! - `CHECK-NOT: p`: `p` does not occur between the previous match and the next one (or the
//!   end of the text).

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckKind {
    Check,
    Next,
    Same,
    Not,
}

impl CheckKind {
    fn directive(self) -> &'static str {
        match self {
            CheckKind::Check => "CHECK",
            CheckKind::Next => "CHECK-NEXT",
            CheckKind::Same => "CHECK-SAME",
            CheckKind::Not => "CHECK-NOT",
        }
    }

    /// The kind a directive names (`CHECK-NEXT`), if it names one.
    pub fn from_directive(directive: &str) -> Option<CheckKind> {
        [
            CheckKind::Check,
            CheckKind::Next,
            CheckKind::Same,
            CheckKind::Not,
        ]
        .into_iter()
        .find(|k| k.directive() == directive)
    }
}

/// One check line of a case file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub kind: CheckKind,
    pub pattern: String,
    /// The line of the case file it is on (1-based), for errors.
    pub line: usize,
}

/// A check that failed: which, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct CheckFailure {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// The byte offset where line `line` (0-based) of `text` starts, and where it ends.
fn line_bounds(text: &str, line: usize) -> Option<(usize, usize)> {
    let mut start = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i == line {
            return Some((start, start + l.trim_end_matches('\n').len()));
        }
        start += l.len();
    }
    None
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset].matches('\n').count()
}

/// Matches `checks` against `text`, in order; the first failure is returned.
pub fn match_checks(text: &str, checks: &[Check]) -> Result<(), CheckFailure> {
    // The end of the previous positive match, and the line it was on.
    let mut cursor = 0usize;
    let mut last_line: Option<usize> = None;
    let mut pending_nots: Vec<&Check> = Vec::new();
    let fail = |c: &Check, message: String| CheckFailure {
        line: c.line,
        message: format!("{}: {:?} {message}", c.kind.directive(), c.pattern),
    };
    for check in checks {
        let found = match check.kind {
            CheckKind::Not => {
                pending_nots.push(check);
                continue;
            }
            CheckKind::Check => text[cursor..].find(&check.pattern).map(|at| cursor + at),
            CheckKind::Next | CheckKind::Same => {
                let Some(previous) = last_line else {
                    return Err(fail(check, "has no previous match to follow".into()));
                };
                let line = if check.kind == CheckKind::Next {
                    previous + 1
                } else {
                    previous
                };
                let Some((start, end)) = line_bounds(text, line) else {
                    return Err(fail(
                        check,
                        "comes after the last line of the output".into(),
                    ));
                };
                let from = cursor.max(start);
                text[from..end].find(&check.pattern).map(|at| from + at)
            }
        };
        let Some(at) = found else {
            let place = match check.kind {
                CheckKind::Next => "on the line after the previous match",
                CheckKind::Same => "on the previous match's line, after it",
                _ => "after the previous match",
            };
            return Err(fail(check, format!("is not {place}")));
        };
        for not in pending_nots.drain(..) {
            if text[cursor..at].contains(&not.pattern) {
                return Err(fail(not, "occurs before the next match".into()));
            }
        }
        cursor = at + check.pattern.len();
        last_line = Some(line_of(text, at));
    }
    for not in pending_nots {
        if text[cursor..].contains(&not.pattern) {
            return Err(fail(not, "occurs after the last match".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(lines: &[(CheckKind, &str)]) -> Vec<Check> {
        lines
            .iter()
            .enumerate()
            .map(|(i, (kind, pattern))| Check {
                kind: *kind,
                pattern: pattern.to_string(),
                line: i + 1,
            })
            .collect()
    }

    const TEXT: &str = "a = add x y\nb = mul a a\nreturn b\n";

    #[test]
    fn checks_match_in_order() {
        use CheckKind::*;
        assert_eq!(
            match_checks(
                TEXT,
                &checks(&[(Check, "add"), (Check, "mul"), (Check, "return")])
            ),
            Ok(())
        );
        let out_of_order = match_checks(TEXT, &checks(&[(Check, "mul"), (Check, "add")]));
        assert_eq!(out_of_order.unwrap_err().line, 2);
    }

    #[test]
    fn next_and_same_hold_to_their_lines() {
        use CheckKind::*;
        assert_eq!(
            match_checks(TEXT, &checks(&[(Check, "add"), (Same, "y"), (Next, "mul")])),
            Ok(())
        );
        let skipped = match_checks(TEXT, &checks(&[(Check, "add"), (Next, "return")]));
        assert!(skipped.unwrap_err().message.contains("line after"));
        let other_line = match_checks(TEXT, &checks(&[(Check, "add"), (Same, "mul")]));
        assert_eq!(other_line.unwrap_err().line, 2);
        let first = match_checks(TEXT, &checks(&[(Next, "add")]));
        assert!(first.unwrap_err().message.contains("no previous match"));
    }

    #[test]
    fn not_holds_between_matches_and_at_the_end() {
        use CheckKind::*;
        assert_eq!(
            match_checks(
                TEXT,
                &checks(&[(Check, "add"), (Not, "sub"), (Check, "mul")])
            ),
            Ok(())
        );
        let between = match_checks(
            TEXT,
            &checks(&[(Check, "add"), (Not, "mul"), (Check, "return")]),
        );
        assert_eq!(between.unwrap_err().line, 2);
        let at_end = match_checks(TEXT, &checks(&[(Check, "add"), (Not, "return")]));
        assert!(at_end.unwrap_err().message.contains("after the last match"));
        assert_eq!(match_checks(TEXT, &checks(&[(Not, "div")])), Ok(()));
    }
}
