//! Builds the fake clock that the tests preload into servers whose wall clock they move
//! (`fake_clock.c`), for `src/lib.rs` to carry in its binary.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=fake_clock.c");
    println!("cargo::rerun-if-env-changed=CC");
    let library = PathBuf::from(env::var_os("OUT_DIR").unwrap()).join("fake_clock.so");
    let compiler = env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&compiler)
        .args([
            "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
        ])
        .arg(&library)
        .arg("fake_clock.c")
        .status()
        .unwrap_or_else(|error| panic!("running the C compiler {compiler}: {error}"));
    assert!(status.success(), "{compiler} could not build fake_clock.c");
}
