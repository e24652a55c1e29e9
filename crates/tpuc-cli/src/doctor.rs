//! `tpuc doctor`'s output: the report (`tpuc_driver::doctor`) as text or JSON, and its exit
//! status.

use std::path::Path;

use anyhow::{Context, Result};
use tpuc_driver::doctor::{examine, DoctorOptions};

/// How `tpuc doctor` ends when it does not end well: the exit status and, where the report
/// could not be made, why.
#[derive(Debug)]
pub enum Verdict {
    /// The report was printed and names problems: status 1.
    Unhealthy,
    /// The program or the plugin could not be read (already said on standard error): status 2.
    CannotExamine,
}

impl Verdict {
    pub fn exit_status(&self) -> u8 {
        match self {
            Verdict::Unhealthy => 1,
            Verdict::CannotExamine => 2,
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Unhealthy => f.write_str("the program has problems"),
            Verdict::CannotExamine => f.write_str("the program could not be examined"),
        }
    }
}

impl std::error::Error for Verdict {}

/// How `tpuc doctor` gives its report.
pub struct Output {
    /// JSON on standard output instead of text.
    pub json: bool,
    /// Also a page written there.
    pub html: Option<std::path::PathBuf>,
    /// Fail on a per-size compile too.
    pub strict: bool,
}

/// Examines `model`, prints the report (as `output` says) and fails with the verdict's status
/// when it names problems.
pub fn doctor(model: &Path, options: &DoctorOptions, output: &Output) -> Result<()> {
    let mut report = match examine(model, options) {
        Ok(report) => report,
        Err(e) => {
            eprintln!(
                "error: cannot examine {}: {:#}",
                model.display(),
                anyhow::Error::from(e)
            );
            return Err(Verdict::CannotExamine.into());
        }
    };
    if output.strict {
        if let Some(why) = &report.coverage.per_size {
            report.problems.push(format!(
                "compiles per size, not per bucket (--strict): {why}"
            ));
        }
    }
    if let Some(path) = &output.html {
        let page = tpuc_driver::doctor::page(
            &format!("tpuc doctor: {}", report.program),
            &serde_json::to_string(&report)?,
        );
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
    }
    if output.json {
        say!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        say!("{}", tpuc_driver::doctor::text(&report))?;
    }
    if !report.healthy() {
        return Err(Verdict::Unhealthy.into());
    }
    Ok(())
}
