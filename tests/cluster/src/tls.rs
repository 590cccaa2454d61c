//! Throwaway certificates made with the `openssl` command line, readable by the servers' user.

use crate::{assert_success, give_to_postgres};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert_success(&output, format_args!("openssl {args:?} failed: "));
}

/// The arguments of `openssl req` for a new P-256 key, unencrypted, written to `key`, then `rest`.
fn new_key_request<'a>(key: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        key,
    ];
    args.extend_from_slice(rest);
    args
}

/// A self-signed CA certificate `<name>.crt` with its key `<name>.key` in `dir`.
pub fn certificate_authority(dir: &Path, name: &str) -> PathBuf {
    let (key, cert) = (format!("{name}.key"), format!("{name}.crt"));
    let subject = format!("/CN=snowid test {name}");
    let rest = [
        "-x509",
        "-out",
        &cert,
        "-days",
        "2",
        "-subj",
        &subject,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ];
    openssl(dir, &new_key_request(&key, &rest));
    let cert = dir.join(cert);
    give_to_postgres(&cert, 0o644);
    give_to_postgres(&dir.join(key), 0o600);
    cert
}

/// A certificate `<name>.crt` with its key `<name>.key` in `dir`, signed by the CA `ca` (made by
/// [`certificate_authority`] in the same directory), for `subject` (`/CN=node1`, say) and the
/// `subjectAltName` `alt_names` (`DNS:localhost`, say) if any.
pub fn certificate(
    dir: &Path,
    ca: &str,
    name: &str,
    subject: &str,
    alt_names: Option<&str>,
) -> (PathBuf, PathBuf) {
    let (key, csr, cert, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    let mut extensions = "extendedKeyUsage = serverAuth, clientAuth\n".to_string();
    if let Some(alt_names) = alt_names {
        extensions.push_str(&format!("subjectAltName = {alt_names}\n"));
    }
    fs::write(dir.join(&ext), extensions).unwrap();
    openssl(
        dir,
        &new_key_request(&key, &["-out", &csr, "-subj", subject]),
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
    let (cert, key) = (dir.join(cert), dir.join(key));
    give_to_postgres(&cert, 0o644);
    give_to_postgres(&key, 0o600);
    (cert, key)
}
