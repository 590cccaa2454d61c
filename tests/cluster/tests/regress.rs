//! SQL regression files: each `tests/regress/sql/NAME.sql` runs through psql in a database of its
//! own and must print exactly `tests/regress/expected/NAME.out`, or, on a server built without ICU
//! (PostgreSQL 16 from the pgserver wheel), the alternative `NAME_1.out` (pg_regress's convention). The README's examples are checked
//! against these outputs, and its benchmark figures against the committed results, so that the
//! README cannot drift from the code.

use snowid_cluster_tests::{pg_config, Cluster};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn regress_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../regress")
}

/// Error locations name lines of snowid's source; they are not part of the contract.
fn without_locations(output: &str) -> String {
    output
        .lines()
        .filter(|line| !line.starts_with("LOCATION:"))
        .map(|line| format!("{line}\n"))
        .collect()
}

#[test]
fn sql_files_print_their_expected_output() {
    let cluster = Cluster::start(
        "regress",
        &[
            "shared_preload_libraries = 'snowid'",
            "snowid.worker_id = 17",
            "snowid.database = 'usage'",
            "timezone = 'UTC'",
        ],
    );
    let results = Path::new(env!("CARGO_TARGET_TMPDIR")).join("regress-results");
    fs::create_dir_all(&results).unwrap();
    let mut files: Vec<PathBuf> = fs::read_dir(regress_dir().join("sql"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 2);
    let mut failures = vec![];
    for file in &files {
        let name = file.file_stem().unwrap().to_str().unwrap();
        cluster
            .connect()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let actual = results.join(format!("{name}.out"));
        fs::write(&actual, without_locations(&cluster.psql_file(name, file))).unwrap();
        let expected = regress_dir().join("expected").join(format!("{name}.out"));
        let alternative = regress_dir().join("expected").join(format!("{name}_1.out"));
        let without_icu = pg_config("--configure").contains("--without-icu");
        let diff = |expected: &Path| {
            Command::new("diff")
                .arg("-u")
                .arg(expected)
                .arg(&actual)
                .output()
                .unwrap()
        };
        let differences = diff(&expected);
        let as_expected = differences.status.success()
            || (without_icu && alternative.is_file() && diff(&alternative).status.success());
        if !as_expected {
            failures.push(String::from_utf8_lossy(&differences.stdout).into_owned());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_psql_example_in_the_readme_is_in_an_expected_output() {
    let trimmed = |text: &str| {
        text.lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let readme =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let expected: Vec<String> = fs::read_dir(regress_dir().join("expected"))
        .unwrap()
        .map(|entry| trimmed(&fs::read_to_string(entry.unwrap().path()).unwrap()))
        .collect();
    let examples: Vec<&str> = readme
        .split("```psql\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap())
        .collect();
    assert!(
        examples.len() >= 5,
        "the README shows its examples in ```psql blocks"
    );
    for example in examples {
        let example = trimmed(example);
        assert!(
            expected.iter().any(|output| output.contains(&example)),
            "README example not found in tests/regress/expected:\n{example}"
        );
    }
}

#[test]
fn the_readme_shows_the_committed_benchmark_results_of_every_major() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    // Each benchmark's results file and its chart, by major.
    let benchmarks = [
        ("pg15", "results", "chart"),
        ("pg16", "results", "chart"),
        ("pg17", "results", "chart"),
        ("pg18", "results", "chart"),
        ("pg15", "growth", "growth"),
        ("pg18", "growth", "growth"),
    ];
    for (major, results, chart) in benchmarks {
        let dir = format!("benches/results/{major}");
        let text = fs::read_to_string(root.join(&dir).join(format!("{results}.md"))).unwrap();
        assert!(
            readme.contains(text.trim()),
            "README.md does not show {dir}/{results}.md as it is"
        );
        let chart = format!("{dir}/{chart}.png");
        assert!(
            readme.contains(&format!("]({chart})")),
            "README.md does not show {chart}"
        );
        assert!(root.join(&chart).is_file(), "{chart} is missing");
    }
    // The last comparison of two builds, which has no chart.
    let compare = fs::read_to_string(root.join("benches/results/pg15/compare.md")).unwrap();
    assert!(
        readme.contains(compare.trim()),
        "README.md does not show benches/results/pg15/compare.md as it is"
    );
}
