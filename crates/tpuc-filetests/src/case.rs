//! A case file: what to do with the graph (`test ...`), the graph ([`crate::graph_text`]) and
//! `CHECK` lines ([`crate::check`]) on what comes out. Lines starting with `;` are comments; a
//! comment `; CHECK: text` (or `CHECK-NEXT`, `CHECK-SAME`, `CHECK-NOT`) is a check.
//!
//! ```text
//! ; A linear layer's matmul contracts the input's last dimension with the weight's.
//! test lower
//! input x: float32[2, 3]
//! parameter w: float32[4, 3]
//! y: float32[2, 4] = aten.linear.default(input=x, weight=w, bias=None)
//! output y
//! ; CHECK: stablehlo.dot_general
//! ; CHECK-SAME: contracting_dims = [1] x [1]
//! ```
//!
//! What a case does (`test` and its words):
//! - `lower`: lowers the graph and runs the pipeline (verified after each pass); the checks
//!   read the printed IR.
//! - `lower-only`: lowers the graph and verifies it, no passes.
//! - `pass NAME...`: lowers the graph, then runs only these passes in this order (verified
//!   after each); [`Pass`] lists them.
//! - `emit`: as `lower`, then emits StableHLO text through MLIR; the checks read that.
//! - `error`: lowering (or the pipeline) must fail; the checks read the error.
//!
//! `lower`, `emit` and `error` take `fusion=patterns` (or `kernels`) after them: the graph is
//! lowered and passed with that fusion choice (composites, `passes::fusion`).

use tpuc_fx::Program;
use tpuc_hlo::passes::Fusion;

use crate::check::{Check, CheckKind};
use crate::graph_text::{parse_program, ParseError};

/// A pass a `pass` case can run on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Fold,
    Canonicalize,
    DeadCode,
    NarrowArithmetic,
    ExactDivision,
    BoolConstants,
}

impl Pass {
    const ALL: [(Pass, &'static str); 6] = [
        (Pass::Fold, "fold"),
        (Pass::Canonicalize, "canonicalize"),
        (Pass::DeadCode, "dead-code"),
        (Pass::NarrowArithmetic, "narrow-arithmetic"),
        (Pass::ExactDivision, "exact-division"),
        (Pass::BoolConstants, "bool-constants"),
    ];

    pub fn name(self) -> &'static str {
        Pass::ALL.iter().find(|(p, _)| *p == self).unwrap().1
    }

    fn from_name(name: &str) -> Option<Pass> {
        Pass::ALL.iter().find(|(_, n)| *n == name).map(|(p, _)| *p)
    }

    fn names() -> String {
        Pass::ALL.map(|(_, n)| n).join(", ")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TestKind {
    Lower,
    LowerOnly,
    Passes(Vec<Pass>),
    Emit,
    Error,
}

#[derive(Debug)]
pub struct Case {
    pub test: TestKind,
    /// The fusion choice the case lowers and passes with (`fusion=...`; none by default).
    pub fusion: Fusion,
    pub program: Program,
    pub checks: Vec<Check>,
}

/// Reads a case file's text.
pub fn parse_case(text: &str) -> Result<Case, ParseError> {
    let mut test = None;
    let mut checks = Vec::new();
    let mut graph_lines = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        let error = |message: String| ParseError { line, message };
        if let Some(comment) = trimmed.strip_prefix(';') {
            if let Some(check) = check_line(comment.trim_start(), line)? {
                checks.push(check);
            }
        } else if let Some(words) = trimmed.strip_prefix("test ") {
            if test.is_some() {
                return Err(error("a case has one `test` line".into()));
            }
            test = Some(test_kind(words).map_err(error)?);
        } else if !trimmed.is_empty() {
            graph_lines.push((line, trimmed));
        }
    }
    let test = test.ok_or_else(|| ParseError {
        line: 1,
        message: "the case has no `test` line (test lower, lower-only, pass NAME..., emit, error)"
            .into(),
    })?;
    if !checks.iter().any(|c| c.kind != CheckKind::Not) {
        return Err(ParseError {
            line: text.lines().count(),
            message: "the case has no CHECK line: it would pass whatever the output".into(),
        });
    }
    let program = parse_program(&graph_lines)?;
    let (test, fusion) = test;
    Ok(Case {
        test,
        fusion,
        program,
        checks,
    })
}

fn test_kind(words: &str) -> Result<(TestKind, Fusion), String> {
    let mut words = words.split_whitespace();
    let kind = match words.next() {
        Some("lower") => TestKind::Lower,
        Some("lower-only") => TestKind::LowerOnly,
        Some("emit") => TestKind::Emit,
        Some("error") => TestKind::Error,
        Some("pass") => {
            let passes = words
                .by_ref()
                .map(|name| {
                    Pass::from_name(name).ok_or_else(|| {
                        format!("no pass is named {name} (passes: {})", Pass::names())
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            if passes.is_empty() {
                return Err(format!("`test pass` names passes: {}", Pass::names()));
            }
            return Ok((TestKind::Passes(passes), Fusion::None));
        }
        other => {
            return Err(format!(
                "unknown test {:?} (lower, lower-only, pass NAME..., emit, error)",
                other.unwrap_or("")
            ))
        }
    };
    let fusion = match words.next() {
        Some(word) => match word.strip_prefix("fusion=") {
            Some(choice) => choice.parse::<Fusion>()?,
            None => return Err(format!("unexpected {word:?} after the test's kind")),
        },
        None => Fusion::None,
    };
    match words.next() {
        Some(extra) => Err(format!("unexpected {extra:?} after the test's kind")),
        None => Ok((kind, fusion)),
    }
}

/// The check a comment holds, if it is one (`CHECK-NEXT: text`).
fn check_line(comment: &str, line: usize) -> Result<Option<Check>, ParseError> {
    let Some((directive, pattern)) = comment.split_once(':') else {
        return Ok(None);
    };
    if !directive.starts_with("CHECK") {
        return Ok(None);
    }
    let kind = CheckKind::from_directive(directive).ok_or_else(|| ParseError {
        line,
        message: format!(
            "unknown directive {directive} (CHECK, CHECK-NEXT, CHECK-SAME, CHECK-NOT)"
        ),
    })?;
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return Err(ParseError {
            line,
            message: format!("{directive} has no text to look for"),
        });
    }
    Ok(Some(Check {
        kind,
        pattern: pattern.to_string(),
        line,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRAPH: &str = "input x: float32[2]\ny: float32[2] = aten.neg.default(self=x)\noutput y\n";

    #[test]
    fn a_case_reads_its_test_graph_and_checks() {
        let case = parse_case(&format!(
            "; Negation.\ntest pass fold dead-code\n{GRAPH}; CHECK: stablehlo.negate\n; CHECK-NOT: add"
        ))
        .unwrap();
        assert_eq!(
            case.test,
            TestKind::Passes(vec![Pass::Fold, Pass::DeadCode])
        );
        assert_eq!(case.checks.len(), 2);
        assert_eq!(case.checks[1].kind, CheckKind::Not);
        assert_eq!(case.checks[0].line, 6);
        assert_eq!(case.program.graph().nodes.len(), 1);
    }

    #[test]
    fn bad_cases_are_refused_naming_the_line() {
        let cases = [
            (format!("{GRAPH}; CHECK: negate"), "no `test` line"),
            (format!("test lower\n{GRAPH}"), "no CHECK line"),
            (
                format!("test lower\n{GRAPH}; CHECK-NOT: add"),
                "no CHECK line",
            ),
            (
                format!("test pass fuse\n{GRAPH}; CHECK: negate"),
                "no pass is named fuse",
            ),
            (
                format!("test run\n{GRAPH}; CHECK: negate"),
                "unknown test \"run\"",
            ),
            (
                format!("test lower\n{GRAPH}; CHECK-LATER: negate"),
                "unknown directive",
            ),
            (
                format!("test lower\n{GRAPH}; CHECK:"),
                "no text to look for",
            ),
            (
                format!("test lower\ntest emit\n{GRAPH}; CHECK: x"),
                "one `test` line",
            ),
        ];
        for (text, needle) in cases {
            let e = parse_case(&text).unwrap_err();
            assert!(e.message.contains(needle), "{text}:\n{e}");
        }
    }
}
