//! What snowid makes of a libpq connection string, once libpq parsed it into its options: the
//! parameters of the lease worker's sessions, one set for each host to try, each host's deadline,
//! and how to name the registry without its secrets.

use std::time::Duration;

/// libpq options as keyword and value, in the order given.
pub type Options = Vec<(String, String)>;

/// How long one host may take to connect unless `connect_timeout` says otherwise.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a statement of the lease worker may run on the registry.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings of the worker's registry sessions, after any the connection string gives: a search
/// path no role can put objects in, commits that wait for a synchronous standby, warnings sent to
/// the client (a cancelled wait for that standby is one), bounded waits.
fn session_options() -> String {
    let ms = STATEMENT_TIMEOUT.as_millis();
    format!(
        "-c search_path=pg_catalog,pg_temp -c synchronous_commit=on -c client_min_messages=warning \
         -c statement_timeout={ms} -c lock_timeout={ms}"
    )
}

/// libpq's `connect_timeout`, which it applies only to blocking connections, as the deadline of
/// each host; libpq reads values below 2 s as 2 s, and 0 as none, for which snowid keeps its own.
pub fn connect_timeout(options: &Options) -> Duration {
    lookup(options, "connect_timeout")
        .and_then(|value| value.trim().parse::<u64>().ok())
        .filter(|&seconds| seconds > 0)
        .map_or(CONNECT_TIMEOUT, |seconds| {
            Duration::from_secs(seconds.max(2))
        })
}

/// The options given, with the worker's own session settings and application name added.
pub fn session_parameters(mut options: Options) -> Options {
    match options.iter_mut().find(|(key, _)| key == "options") {
        Some((_, given)) => *given = format!("{given} {}", session_options()),
        None => options.push(("options".into(), session_options())),
    }
    options.push((
        "fallback_application_name".into(),
        "snowid lease worker".into(),
    ));
    options
}

/// One set of parameters for each host the options list, in order, when their host, hostaddr and
/// port lists match up; otherwise the options as they are, for libpq to try or to explain.
pub fn per_host(options: Options) -> Vec<Options> {
    let list = |key| -> Vec<String> {
        lookup(&options, key).map_or(vec![], |value| {
            value.split(',').map(str::to_string).collect()
        })
    };
    let (hosts, addresses, ports) = (list("host"), list("hostaddr"), list("port"));
    let count = hosts.len().max(addresses.len());
    let fits = |items: &Vec<String>| items.is_empty() || items.len() == count;
    if count < 2
        || !fits(&hosts)
        || !fits(&addresses)
        || !(ports.len() <= 1 || ports.len() == count)
    {
        return vec![options];
    }
    (0..count)
        .map(|index| {
            let pick = |items: &Vec<String>| items.get(index).or(items.first()).cloned();
            options
                .iter()
                .filter_map(|(key, value)| {
                    let value = match key.as_str() {
                        "host" => pick(&hosts)?,
                        "hostaddr" => pick(&addresses)?,
                        "port" => pick(&ports)?,
                        _ => value.clone(),
                    };
                    Some((key.clone(), value))
                })
                .collect()
        })
        .collect()
}

pub fn lookup<'a>(options: &'a [(String, String)], key: &str) -> Option<&'a str> {
    options
        .iter()
        .find(|(name, _)| name == key)
        .map(|(_, value)| value.as_str())
}

/// How someone on the path could forge the answers of a session with these options, as libpq
/// took them (the connection string with its service file and environment): `None` over a unix
/// socket in the file system, or over TCP with a server certificate verified (`sslmode`
/// `verify-ca` or `verify-full`). An abstract socket (`@name`) has no file permissions: any local
/// process may take its name while the registry is down.
pub fn unverified(effective: &[(String, String)]) -> Option<String> {
    let list = |key| lookup(effective, key).unwrap_or("").split(',').collect::<Vec<_>>();
    let (hosts, addresses) = (list("host"), list("hostaddr"));
    // A host without an address is a socket when libpq's default (empty) or a path.
    let entries = (0..hosts.len().max(addresses.len())).map(|index| {
        let address = addresses.get(index).or(addresses.first()).unwrap_or(&"");
        let host = hosts.get(index).or(hosts.first()).unwrap_or(&"").trim();
        (address.trim(), host)
    });
    let (mut over_tcp, mut abstract_socket) = (false, false);
    for (address, host) in entries {
        if address.is_empty() && host.starts_with('@') {
            abstract_socket = true;
        } else if !address.is_empty() || !(host.is_empty() || host.starts_with('/')) {
            over_tcp = true;
        }
    }
    let sslmode = lookup(effective, "sslmode").unwrap_or("prefer");
    if over_tcp && !matches!(sslmode, "verify-ca" | "verify-full") {
        Some(format!("reached over TCP with sslmode={sslmode}"))
    } else if abstract_socket {
        Some("reached over an abstract unix socket, which any local process may take".into())
    } else {
        None
    }
}

/// The registry as `snowid_status()` names it: by the service, database, hosts and ports the
/// options give, never by their other options (a password among them).
pub fn describe(options: &Options) -> String {
    let mut parts = vec![];
    if let Some(service) = lookup(options, "service") {
        parts.push(format!("service \"{service}\""));
    }
    if let Some(database) = lookup(options, "dbname") {
        parts.push(format!("database \"{database}\""));
    }
    if let Some(hosts) = lookup(options, "host").or(lookup(options, "hostaddr")) {
        parts.push(format!("on {hosts}"));
    }
    if let Some(ports) = lookup(options, "port") {
        parts.push(format!("port {ports}"));
    }
    if parts.is_empty() {
        "libpq's default server".into()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> Options {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    const SESSION: &str = "-c search_path=pg_catalog,pg_temp -c synchronous_commit=on \
                           -c client_min_messages=warning -c statement_timeout=2000 \
                           -c lock_timeout=2000";

    #[test]
    fn sessions_get_the_workers_settings_after_the_given_ones() {
        assert_eq!(
            session_parameters(options(&[("host", "a"), ("options", "-c work_mem=4MB")])),
            options(&[
                ("host", "a"),
                ("options", &format!("-c work_mem=4MB {SESSION}")),
                ("fallback_application_name", "snowid lease worker"),
            ])
        );
        assert_eq!(
            session_parameters(options(&[("service", "registry")])),
            options(&[
                ("service", "registry"),
                ("options", SESSION),
                ("fallback_application_name", "snowid lease worker"),
            ])
        );
    }

    #[test]
    fn each_host_is_tried_with_its_own_address_and_port() {
        let given = options(&[
            ("host", "a,b"),
            ("hostaddr", "10.0.0.1,10.0.0.2"),
            ("port", "5432,5433"),
            ("sslmode", "verify-full"),
        ]);
        assert_eq!(
            per_host(given),
            vec![
                options(&[
                    ("host", "a"),
                    ("hostaddr", "10.0.0.1"),
                    ("port", "5432"),
                    ("sslmode", "verify-full"),
                ]),
                options(&[
                    ("host", "b"),
                    ("hostaddr", "10.0.0.2"),
                    ("port", "5433"),
                    ("sslmode", "verify-full"),
                ]),
            ]
        );
        assert_eq!(
            per_host(options(&[("host", "a,b,c"), ("port", "6000")])),
            vec![
                options(&[("host", "a"), ("port", "6000")]),
                options(&[("host", "b"), ("port", "6000")]),
                options(&[("host", "c"), ("port", "6000")]),
            ]
        );
    }

    #[test]
    fn lists_that_do_not_match_up_are_left_for_libpq_to_explain() {
        for given in [
            options(&[("host", "a")]),
            options(&[("host", "a,b"), ("port", "1,2,3")]),
            options(&[("host", "a,b"), ("hostaddr", "10.0.0.1")]),
            options(&[("dbname", "postgres")]),
        ] {
            assert_eq!(per_host(given.clone()), vec![given]);
        }
    }

    #[test]
    fn a_host_gets_libpqs_connect_timeout_or_two_seconds() {
        let timeout = |value| connect_timeout(&options(&[("connect_timeout", value)]));
        assert_eq!(timeout("10"), Duration::from_secs(10));
        assert_eq!(timeout("1"), Duration::from_secs(2));
        assert_eq!(timeout("0"), Duration::from_secs(2));
        assert_eq!(timeout("soon"), Duration::from_secs(2));
        assert_eq!(connect_timeout(&options(&[])), Duration::from_secs(2));
    }

    #[test]
    fn only_a_socket_or_a_verified_certificate_keeps_the_path_from_forging_answers() {
        let judge = |pairs: &[(&str, &str)]| unverified(&options(pairs));
        assert_eq!(judge(&[]), None);
        assert_eq!(judge(&[("host", "/var/run/postgresql")]), None);
        assert_eq!(
            judge(&[("host", "@abstract")]),
            Some("reached over an abstract unix socket, which any local process may take".into())
        );
        assert_eq!(
            judge(&[("host", "db1"), ("sslmode", "verify-full")]),
            None
        );
        assert_eq!(
            judge(&[("hostaddr", "10.0.0.5"), ("sslmode", "verify-ca")]),
            None
        );
        let over_tcp = |mode: &str| Some(format!("reached over TCP with sslmode={mode}"));
        assert_eq!(judge(&[("host", "localhost")]), over_tcp("prefer"));
        assert_eq!(
            judge(&[("host", "db1"), ("sslmode", "require")]),
            over_tcp("require")
        );
        // An address makes a host TCP, even one written as a path.
        assert_eq!(
            judge(&[("host", "/tmp"), ("hostaddr", "127.0.0.1")]),
            over_tcp("prefer")
        );
        // One host of a list over TCP is enough.
        assert_eq!(
            judge(&[("host", "/tmp,db2"), ("sslmode", "disable")]),
            over_tcp("disable")
        );
        assert_eq!(
            judge(&[("host", "/tmp,/var/run/postgresql"), ("sslmode", "disable")]),
            None
        );
    }

    #[test]
    fn the_registry_is_named_without_its_secrets() {
        assert_eq!(
            describe(&options(&[
                ("host", "r1,r2"),
                ("port", "5432,5433"),
                ("dbname", "leases"),
                ("user", "node1"),
                ("password", "hunter2"),
                ("sslmode", "verify-full"),
            ])),
            "database \"leases\" on r1,r2 port 5432,5433"
        );
        assert_eq!(
            describe(&options(&[
                ("service", "registry"),
                ("password", "hunter2")
            ])),
            "service \"registry\""
        );
        assert_eq!(describe(&options(&[])), "libpq's default server");
    }
}
