//! `nemesis [--seed N] [--minutes M] [--registry postgres|etcd] --report DIR`: runs the fault
//! schedule of seed N (drawn at random and printed when not given) for M minutes (3 by default)
//! against the installed snowid, and writes its report into DIR. Exits 1 when a check failed.
//! Needs root, for the network namespaces; `scripts/nemesis.sh` runs it.

use snowid_cluster_tests::nemesis::report::can_write;
use snowid_cluster_tests::nemesis::schedule::Registry;
use snowid_cluster_tests::nemesis::{run, Options};
use std::path::PathBuf;
use std::time::Duration;

/// Every call and id stays in memory until the end: about 5 GB for three hours.
const MAX_MINUTES: f64 = 180.0;

const USAGE: &str =
    "usage: nemesis [--seed N] [--minutes M] [--registry postgres|etcd] --report DIR";

fn main() {
    let mut seed = None;
    let mut minutes = 3.0;
    let mut registry = None;
    let mut report = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--seed" => {
                seed = Some(
                    value
                        .parse()
                        .unwrap_or_else(|_| fail("--seed takes a whole number")),
                )
            }
            "--minutes" => {
                minutes = value
                    .parse()
                    .ok()
                    .filter(|m: &f64| *m > 0.0 && *m <= MAX_MINUTES)
                    .unwrap_or_else(|| fail("--minutes takes a number of minutes, up to 180"))
            }
            "--registry" => {
                registry = Some(
                    Registry::named(&value)
                        .filter(|registry| *registry != Registry::OnTheServer)
                        .unwrap_or_else(|| fail("--registry is postgres or etcd")),
                )
            }
            "--report" => report = Some(PathBuf::from(value)),
            _ => fail(&format!("unknown option {flag}")),
        }
    }
    let seed = seed.unwrap_or_else(random_seed);
    let report = report.unwrap_or_else(|| fail("--report is needed"));
    if !can_write(&report) {
        fail(&format!(
            "{} holds files of its own: name an empty folder",
            report.display()
        ));
    }
    let options = Options {
        seed,
        length: Duration::from_secs_f64(minutes * 60.0),
        registry: registry.unwrap_or(Registry::of_seed(seed)),
        report,
        commit: commit(),
    };
    let passed = run(&options);
    println!("\nreport: {}", options.report.display());
    std::process::exit(if passed { 0 } else { 1 });
}

/// The commit of the working directory, marked when it has changes.
fn commit() -> String {
    std::process::Command::new("git")
        // Run as root, in a checkout another user may own.
        .args([
            "-c",
            "safe.directory=*",
            "describe",
            "--always",
            "--dirty",
            "--abbrev=12",
        ])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// A seed from the kernel's random numbers, below 2^32 so that it is easy to type again.
fn random_seed() -> u64 {
    let bytes = std::fs::read("/proc/sys/kernel/random/uuid").unwrap();
    let hex: String = bytes
        .iter()
        .filter(|b| b.is_ascii_hexdigit())
        .take(8)
        .map(|&b| b as char)
        .collect();
    u64::from_str_radix(&hex, 16).unwrap()
}

fn fail(message: &str) -> ! {
    eprintln!("nemesis: {message}\n{USAGE}");
    std::process::exit(2);
}
