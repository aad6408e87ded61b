//! The primitive pages (`docs/*.md`) quote tables of `docs/BENCHMARKS.md` under `####`
//! headings named like the report's `###` sections. After a full run writes the report,
//! every quoted section is replaced with the report's section of the same title, so the
//! pages never quote an older run than the report.

use std::path::Path;

/// The body of each `### Title` section of `report` (up to the next `##`/`###` heading).
fn sections(report: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut cur: Option<(String, String)> = None;
    for line in report.lines() {
        if let Some(title) = line.strip_prefix("### ") {
            out.extend(cur.take());
            cur = Some((title.trim().to_string(), String::new()));
        } else if line.starts_with("## ") {
            out.extend(cur.take());
        } else if let Some((_, body)) = &mut cur {
            body.push_str(line);
            body.push('\n');
        }
    }
    out.extend(cur);
    out
}

/// The report section a page's `#### Title` quotes: the same title, or the report's
/// title with a trailing parenthesis the page leaves out.
fn quoted<'a>(title: &str, sections: &'a [(String, String)]) -> Option<&'a str> {
    sections
        .iter()
        .find(|(t, _)| {
            t == title
                || t.strip_prefix(title)
                    .is_some_and(|rest| rest.trim_start().starts_with('('))
        })
        .map(|(_, body)| body.as_str())
}

/// `page` with every `#### Title` section that quotes a report section replaced by it.
pub(crate) fn refresh(page: &str, report: &str) -> String {
    let sections = sections(report);
    let mut out = String::with_capacity(page.len());
    let mut skipping = false;
    for line in page.lines() {
        if skipping {
            if !line.starts_with('#') {
                continue;
            }
            skipping = false;
        }
        out.push_str(line);
        out.push('\n');
        if let Some(title) = line.strip_prefix("#### ")
            && let Some(body) = quoted(title.trim(), &sections)
        {
            out.push_str(body);
            skipping = true;
        }
    }
    if !page.ends_with('\n') {
        out.pop();
    }
    out
}

/// Refreshes the quotes in every page of `docs` (all `.md` files but the report).
pub(crate) fn refresh_pages(docs: &Path, report: &str) -> Result<usize, String> {
    let mut changed = 0;
    let entries = std::fs::read_dir(docs).map_err(|e| format!("{}: {e}", docs.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_none_or(|e| e != "md")
            || path.file_name().is_some_and(|n| n == "BENCHMARKS.md")
        {
            continue;
        }
        let page =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let new = refresh(&page, report);
        if new != page {
            std::fs::write(&path, new).map_err(|e| format!("{}: {e}", path.display()))?;
            changed += 1;
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::refresh;

    const REPORT: &str = "# Benchmarks\n## Single\n### Lease (seed 000)\n\nintro\n\n| a |\n|---|\n| 2 |\n\n### Other\n\nx\n## Missed\n";

    #[test]
    fn a_quoted_section_takes_the_reports_body() {
        let page =
            "# Page\n\n#### Lease\n\nold intro\n\n| a |\n|---|\n| 1 |\n\n## Pitfalls\n\ntext\n";
        let new = refresh(page, REPORT);
        assert_eq!(
            new,
            "# Page\n\n#### Lease\n\nintro\n\n| a |\n|---|\n| 2 |\n\n## Pitfalls\n\ntext\n"
        );
    }

    #[test]
    fn sections_the_report_lacks_stay_as_they_are() {
        let page = "#### Unknown\n\n| 1 |\n\n#### Other\n\ny\n";
        assert_eq!(
            refresh(page, REPORT),
            "#### Unknown\n\n| 1 |\n\n#### Other\n\nx\n"
        );
    }
}
