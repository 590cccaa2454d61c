//! `recovery --registry postgres|etcd|server [--lease-ttl S] [--kinds K,...] [--ratios R,...]
//! [--positions after,before] [--trials N] --report DIR`: the single-fault benchmark (see
//! `snowid_cluster_tests::recovery`) against the installed snowid; writes `recovery.md`,
//! `trials.tsv` and `availability.tsv` into DIR. Needs root, for the network namespaces;
//! `benches/recovery.sh` runs it.

use snowid_cluster_tests::nemesis::schedule::Registry;
use snowid_cluster_tests::recovery::{self, Options, Position, KINDS};
use std::path::PathBuf;

const USAGE: &str =
    "usage: recovery --registry postgres|etcd|server [--lease-ttl S] [--kinds K,...] \
                     [--ratios R,...] [--positions after,before] [--trials N] --report DIR";

fn main() {
    let mut registry = None;
    let mut lease_ttl_s = 6;
    let mut kinds = None;
    let mut ratios = vec![0.5, 0.9, 1.1, 2.0, 4.0];
    let mut positions = vec![Position::AfterRenewal, Position::BeforeRenewal];
    let mut trials = 10;
    let mut report = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        let list = || value.split(',').map(str::to_string).collect::<Vec<_>>();
        match flag.as_str() {
            "--registry" => {
                registry = Some(
                    Registry::named(&value)
                        .unwrap_or_else(|| fail("--registry is postgres, etcd or server")),
                )
            }
            "--lease-ttl" => {
                lease_ttl_s = value
                    .parse()
                    .ok()
                    .filter(|s| (3..=3600).contains(s))
                    .unwrap_or_else(|| fail("--lease-ttl takes seconds, 3 to 3600"))
            }
            "--kinds" => {
                kinds = Some(
                    list()
                        .iter()
                        .map(|name| {
                            *KINDS
                                .iter()
                                .find(|(kind, _)| kind == name)
                                .unwrap_or_else(|| fail(&format!("no fault kind {name}")))
                        })
                        .collect::<Vec<_>>(),
                )
            }
            "--ratios" => {
                ratios = list()
                    .iter()
                    .map(|ratio| {
                        ratio
                            .parse()
                            .ok()
                            .filter(|r: &f64| *r > 0.0 && *r <= 10.0)
                            .unwrap_or_else(|| fail("--ratios takes numbers above 0, up to 10"))
                    })
                    .collect()
            }
            "--positions" => {
                positions = list()
                    .iter()
                    .map(|position| match position.as_str() {
                        "after" => Position::AfterRenewal,
                        "before" => Position::BeforeRenewal,
                        _ => fail("--positions takes after, before"),
                    })
                    .collect()
            }
            "--trials" => {
                trials = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .unwrap_or_else(|| fail("--trials takes a whole number, at least 1"))
            }
            "--report" => report = Some(PathBuf::from(value)),
            _ => fail(&format!("unknown option {flag}")),
        }
    }
    let registry = registry.unwrap_or_else(|| fail("--registry is needed"));
    let report = report.unwrap_or_else(|| fail("--report is needed"));
    let strikes = |(kind, _): &(&str, _)| match registry {
        Registry::Postgres => !kind.starts_with("etcd-"),
        Registry::Etcd => !kind.starts_with("registry-") && *kind != "row-deleted",
        Registry::OnTheServer => {
            !kind.starts_with("etcd-") && !kind.starts_with("registry-") && *kind != "partition"
        }
    };
    let kinds = kinds.unwrap_or_else(|| {
        KINDS
            .iter()
            .filter(|fault| strikes(fault))
            .copied()
            .collect()
    });
    if let Some(other) = kinds.iter().find(|fault| !strikes(fault)) {
        fail(&format!(
            "{} is no fault of a {} registry",
            other.0,
            registry.name()
        ));
    }
    let options = Options {
        registry,
        lease_ttl_s,
        kinds,
        ratios,
        positions,
        trials,
    };
    let (trials, calls) = recovery::run(&options);
    recovery::write(&report, &options, &machine(), &trials, &calls);
    println!(
        "\n{}",
        std::fs::read_to_string(report.join("recovery.md")).unwrap()
    );
}

/// The machine and PostgreSQL the figures come from.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "an unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let postgres = std::process::Command::new(
        std::env::var("PG_CONFIG").unwrap_or_else(|_| "pg_config".into()),
    )
    .arg("--version")
    .output()
    .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    .unwrap_or_default();
    format!("Machine: {cores} cores, {cpu}; {postgres}.")
}

fn fail(message: &str) -> ! {
    eprintln!("recovery: {message}\n{USAGE}");
    std::process::exit(2);
}
