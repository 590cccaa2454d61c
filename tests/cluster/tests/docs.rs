//! The documentation checks itself, in every Markdown file of the repository (the README, `docs/`,
//! the results of `benches/`): each ```psql block is found in a regression test's expected output,
//! so that an example cannot drift from what snowid prints; each relative link names a file that
//! exists and, with an anchor, a heading of it; and each benchmark result is linked, not copied.

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Every Markdown file below `dir`, but in build output, git's own folder and installed
/// packages, in order.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![];
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() && !["target", ".git", "node_modules"].contains(&&*name) {
            files.extend(markdown_files(&path));
        } else if name.ends_with(".md") {
            files.push(path);
        }
    }
    files
}

/// The lines of `text`, each fenced code block's lines (its fences too) left empty.
fn outside_fences(text: &str) -> Vec<&str> {
    let mut in_fence = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                in_fence = !in_fence;
                ""
            } else if in_fence {
                ""
            } else {
                line
            }
        })
        .collect()
}

/// Each line of `text` with its number, but those of fenced code blocks, with inline code blanked
/// out: the prose whose links count. A code span may run onto the next line, and opens and closes
/// with runs of as many backticks.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let prose = outside_fences(text).join("\n");
    // The length of the backtick run that opened the code span we are in, if any.
    let mut open: Option<usize> = None;
    let mut outside = String::new();
    let mut chars = prose.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '`' {
            let mut run = 1;
            while chars.next_if_eq(&'`').is_some() {
                run += 1;
            }
            open = match open {
                None => Some(run),
                Some(opened) if opened == run => None,
                still => still,
            };
            outside.push_str(&" ".repeat(run));
        } else if open.is_some() && c != '\n' {
            outside.push(' ');
        } else {
            outside.push(c);
        }
    }
    outside
        .lines()
        .enumerate()
        .map(|(index, line)| (index + 1, line.to_string()))
        .collect()
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped but `-` and `_`, spaces
/// made `-`.
fn slug(heading: &str) -> String {
    // A link in a heading counts by its text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(start) = rest.find("](") {
        let end = rest[start..]
            .find(')')
            .map_or(rest.len(), |end| start + end + 1);
        text.push_str(&rest[..start]);
        rest = &rest[end..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings; a repeated heading's get `-1`, `-2`, ...
fn anchors(text: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    for line in outside_fences(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if !heading.trim_start_matches('#').starts_with(' ') {
            continue;
        }
        let base = slug(heading.trim_start_matches('#'));
        let mut anchor = base.clone();
        let mut repeat = 0;
        while !anchors.insert(anchor.clone()) {
            repeat += 1;
            anchor = format!("{base}-{repeat}");
        }
    }
    anchors
}

/// The targets of a line's inline links and images, and of a link reference definition.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = vec![];
    let mut rest = line;
    while let Some(start) = rest.find("](") {
        rest = &rest[start + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        targets.push(rest[..end].split_whitespace().next().unwrap_or(""));
        rest = &rest[end..];
    }
    if let Some(definition) = line.trim_start().strip_prefix('[') {
        if let Some((_, target)) = definition.split_once("]: ") {
            targets.push(target.split_whitespace().next().unwrap_or(""));
        }
    }
    targets
}

/// `path` with its `.` and `..` parts resolved, without asking the file system.
fn normalized(path: &Path) -> PathBuf {
    let mut parts = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                parts.pop();
            }
            Component::CurDir => {}
            other => parts.push(other),
        }
    }
    parts
}

/// The file or folder a relative link of `file` points to, and its anchor.
fn resolve<'a>(file: &Path, target: &'a str) -> (PathBuf, Option<&'a str>) {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        normalized(&file.parent().unwrap().join(path))
    };
    (resolved, anchor)
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

/// Every relative link of `files` that names nothing, one line each: the file (relative to
/// `root`), the line, the target and what is wrong.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut broken = vec![];
    for file in files {
        let text = fs::read_to_string(file).unwrap();
        let shown = file.strip_prefix(root).unwrap().display();
        for (number, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                if is_external(target) {
                    continue;
                }
                let (path, anchor) = resolve(file, target);
                if !path.starts_with(root) || !path.exists() {
                    broken.push(format!("{shown}:{number}: ({target}) names no file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                let is_markdown = path.extension().is_some_and(|ext| ext == "md");
                let headings = if is_markdown {
                    anchors(&fs::read_to_string(&path).unwrap())
                } else {
                    HashSet::new()
                };
                if !headings.contains(anchor) {
                    broken.push(format!(
                        "{shown}:{number}: ({target}) names no heading of {}",
                        path.strip_prefix(root).unwrap().display()
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_names_a_file_and_a_heading_that_exist() {
    let root = root();
    let files = markdown_files(&root);
    let shown: Vec<String> = files
        .iter()
        .map(|file| file.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    for expected in ["README.md", "docs/functions.md", "docs/development.md"] {
        assert!(shown.iter().any(|file| file == expected), "{shown:?}");
    }
    let broken = broken_links(&root, &files);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_link_to_a_missing_file_or_heading_is_reported() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docs-links");
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(root.join("docs")).unwrap();
    fs::write(
        root.join("README.md"),
        "# snowid\n\nSee [the functions](docs/functions.md#snowid_next-returns-bigint), \
         [errors](docs/functions.md#errors) and [leases](docs/leases.md).\n\n\
         ```\n[not a link](nowhere.md)\n```\n\n`[nor this](nowhere.md)`, nor a `span that\n\
         runs on [here](nowhere.md)`, but ``two `ticks` [and](then.md)`` [this](after.md).\n",
    )
    .unwrap();
    fs::write(
        root.join("docs/functions.md"),
        "# Functions\n\n## `snowid_next() RETURNS bigint`\n\nBack to [the README](../README.md#snowid) \
         and [this page](#functions), [once more](#functions-1).\n",
    )
    .unwrap();
    let files = markdown_files(&root);
    assert_eq!(
        broken_links(&root, &files),
        [
            "README.md:3: (docs/functions.md#errors) names no heading of docs/functions.md",
            "README.md:3: (docs/leases.md) names no file",
            "README.md:10: (after.md) names no file",
            "docs/functions.md:5: (#functions-1) names no heading of docs/functions.md",
        ]
    );
}

#[test]
fn headings_make_the_anchors_github_makes() {
    let text = "# snowid\n## Upgrading to 0.7.0\n### `snowid_handover(worker_id integer) RETURNS text`\n\
                ## Clients: JSON and JavaScript\n## Growth on PostgreSQL 15\n## Growth on PostgreSQL 15\n\
                ```\n# not a heading\n```\n#not a heading either\n";
    let mut found: Vec<String> = anchors(text).into_iter().collect();
    found.sort();
    assert_eq!(
        found,
        [
            "clients-json-and-javascript",
            "growth-on-postgresql-15",
            "growth-on-postgresql-15-1",
            "snowid",
            "snowid_handoverworker_id-integer-returns-text",
            "upgrading-to-070",
        ]
    );
}

#[test]
fn every_psql_example_is_in_an_expected_output() {
    let trimmed = |text: &str| {
        text.lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let expected_dir = root().join("tests/regress/expected");
    let expected: Vec<String> = fs::read_dir(expected_dir)
        .unwrap()
        .map(|entry| trimmed(&fs::read_to_string(entry.unwrap().path()).unwrap()))
        .collect();
    let mut examples = 0;
    let mut missing = vec![];
    for file in markdown_files(&root()) {
        let text = fs::read_to_string(&file).unwrap();
        for example in text.split("```psql\n").skip(1) {
            let example = trimmed(example.split("```").next().unwrap());
            examples += 1;
            // The block stands in an output as whole lines.
            let lines = format!("\n{example}\n");
            if !expected
                .iter()
                .any(|output| format!("\n{output}\n").contains(&lines))
            {
                missing.push(format!("{}:\n{example}", file.display()));
            }
        }
    }
    assert!(examples >= 18, "only {examples} ```psql blocks found");
    assert!(
        missing.is_empty(),
        "examples not found in tests/regress/expected:\n{}",
        missing.join("\n\n")
    );
}

/// The results of `dir` that a page must link: each fault-schedule report's folder, and every
/// other Markdown file and chart, in subfolders too.
fn results_below(dir: &Path) -> Vec<PathBuf> {
    let mut results = vec![];
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.parent().unwrap().ends_with("nemesis") {
            results.push(path);
        } else if path.is_dir() {
            results.extend(results_below(&path));
        } else if path
            .extension()
            .is_some_and(|ext| ext == "md" || ext == "png")
        {
            results.push(path);
        }
    }
    results
}

/// Each file of a benchmark's results, and each fault-schedule report, is linked from a page of
/// the documentation, which quotes them rather than copying them.
#[test]
fn every_benchmark_result_is_linked_from_the_docs() {
    let root = root();
    let results = root.join("benches/results");
    let mut linked = HashSet::new();
    for file in markdown_files(&root) {
        if file.starts_with(&results) {
            continue;
        }
        for (_, line) in prose_lines(&fs::read_to_string(&file).unwrap()) {
            for target in link_targets(&line) {
                if !is_external(target) {
                    linked.insert(resolve(&file, target).0);
                }
            }
        }
    }
    let mut unlinked: Vec<String> = results_below(&results)
        .into_iter()
        .filter(|result| !linked.contains(result))
        .map(|result| result.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    unlinked.sort();
    assert!(
        unlinked.is_empty(),
        "not linked from any page: {unlinked:?}"
    );
}

/// The majors `scripts/test.sh --all-majors` tests, as `MAJORS=(...)` in scripts/lib.sh lists them.
fn tested_majors() -> Vec<String> {
    let lib = fs::read_to_string(root().join("scripts/lib.sh")).unwrap();
    let list = lib
        .lines()
        .find_map(|line| line.strip_prefix("MAJORS=("))
        .expect("MAJORS=(...) in scripts/lib.sh");
    list.trim_end_matches(')')
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Every page that shows CI's command names the majors it tests beside the first.
#[test]
fn the_pages_name_every_major_that_all_majors_tests() {
    let majors = tested_majors();
    let (first, others) = majors.split_first().unwrap();
    let others = match others {
        [] => String::new(),
        [only] => only.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    };
    let line = format!(
        "scripts/test.sh --all-majors   # CI's: every test on {first}, then the per-major tier on {others}\n"
    );
    for page in ["README.md", "docs/development.md"] {
        let text = fs::read_to_string(root().join(page)).unwrap();
        assert!(text.contains(&line), "{page} lacks: {line}");
    }
}

/// Each alert rule's runbook is the section of docs/monitoring.md named after it.
#[test]
fn every_alert_rule_links_its_runbook_section() {
    let rules = fs::read_to_string(root().join("contrib/prometheus/snowid-alerts.yml")).unwrap();
    let sections = anchors(&fs::read_to_string(root().join("docs/monitoring.md")).unwrap());
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .collect();
    let runbooks: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("runbook: "))
        .map(|runbook| runbook.trim_matches('"'))
        .collect();
    assert_eq!(alerts.len(), 6, "{rules}");
    assert_eq!(alerts.len(), runbooks.len(), "{rules}");
    for (alert, runbook) in alerts.iter().zip(&runbooks) {
        let section = alert.to_lowercase();
        assert_eq!(*runbook, format!("docs/monitoring.md#{section}"));
        assert!(
            sections.contains(&section),
            "docs/monitoring.md has no section {alert}"
        );
    }
}
