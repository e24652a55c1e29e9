//! `tpuc doctor --html FILE`: the report as one self-contained page (no server, no network):
//! the report's JSON embedded, and a script that draws each section from it — each device's
//! memory as a stacked bar, the collectives along the program, the op histogram — so that
//! every number on the page is the JSON's.

use tpuc_driver::doctor::Report;

/// The page of `report`.
pub fn page(report: &Report) -> anyhow::Result<String> {
    // `</script>` inside the data would end the script early.
    let data = serde_json::to_string(report)?.replace("</", "<\\/");
    let title = html_escape(&report.program);
    Ok(TEMPLATE
        .replace("{{TITLE}}", &title)
        .replace("{{REPORT}}", &data))
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page, `{{TITLE}}` and `{{REPORT}}` filled in by [`page`].
const TEMPLATE: &str = include_str!("doctor_page.html");
