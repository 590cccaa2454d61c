//! Links snowid to the libpq of the PostgreSQL it is built for, and records where that libpq lives.
//! A preloaded library's libpq is the one the whole server process then uses, its walreceiver's
//! included, so it must be that server's own: PostgreSQL 18's walreceiver passes options that an
//! older libpq rejects (for PostgreSQL 16 from the pgserver wheel, whose own libpq speaks no TLS,
//! set-up puts a newer one in its library directory: see scripts/postgresql-wheel.sh).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PGRX_PG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PGRX_HOME");
    let pg_config =
        pg_config().expect("pgrx's configuration names the pg_config of the major built for");
    let output = Command::new(&pg_config)
        .arg("--libdir")
        .output()
        .unwrap_or_else(|error| panic!("{} --libdir: {error}", pg_config.display()));
    let libdir = String::from_utf8_lossy(&output.stdout).trim().to_string();
    println!("cargo:rustc-link-search=native={libdir}");
    // scripts/package.sh removes it from the package's copy: there, the system's own libpq belongs
    // to its PostgreSQL.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,{libdir}");
}

/// The pg_config that pgrx builds for: the one cargo-pgrx names, or the one pgrx's configuration
/// gives for the PostgreSQL feature enabled.
fn pg_config() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("PGRX_PG_CONFIG_PATH") {
        return Some(path.into());
    }
    let major = ["pg15", "pg16", "pg17", "pg18"].into_iter().find(|major| {
        std::env::var_os(format!("CARGO_FEATURE_{}", major.to_uppercase())).is_some()
    })?;
    let home = std::env::var_os("PGRX_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".pgrx")))?;
    let config = home.join("config.toml");
    println!("cargo:rerun-if-changed={}", config.display());
    let text = std::fs::read_to_string(config).ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == major).then(|| PathBuf::from(value.trim().trim_matches('"')))
    })
}
