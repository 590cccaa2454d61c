//! SQL regression files: each `tests/regress/sql/NAME.sql` runs through psql in a database of its
//! own and must print exactly `tests/regress/expected/NAME.out`, or, on a server built without ICU
//! (PostgreSQL 16 from the pgserver wheel), the alternative `NAME_1.out` (pg_regress's convention).
//! The documentation's examples are checked against these outputs by `docs.rs`.

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
