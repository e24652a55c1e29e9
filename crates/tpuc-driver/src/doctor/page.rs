//! The report as one self-contained HTML page (no server, no network): its JSON embedded, and a
//! script that draws each section from it — each device's memory as a stacked bar, the
//! collectives along the program, the op histogram, the projection's scaling — so that every
//! number on the page is the JSON's. `tpuc doctor --html` gives it one report; `tpuc.doctor`'s
//! `html()` gives it the model's (its graphs' reports, graph breaks and training state).

/// The page of a report's JSON (`tpuc doctor --json`'s, or `tpuc.doctor`'s `json()`), titled
/// `title`.
pub fn page(title: &str, report_json: &str) -> String {
    // `</script>` inside the data would end the script early.
    let data = report_json.replace("</", "<\\/");
    TEMPLATE
        .replace("{{TITLE}}", &html_escape(title))
        .replace("{{REPORT}}", &data)
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page, `{{TITLE}}` and `{{REPORT}}` filled in by [`page`].
const TEMPLATE: &str = include_str!("page.html");
