//! `snowid.registry` naming an etcd cluster:
//! `etcd://HOST:PORT[,HOST:PORT…]/PREFIX[?OPTION=VALUE&…]`. The options are etcdctl's names for
//! the same things: `cacert` (TLS, verifying the members against that CA file), `cert` and `key`
//! (a client certificate), `user` and `password_file` (etcd's user authentication; the password
//! is read from the file, never written in the setting). Values are taken as written.

/// The scheme that tells an etcd registry from a libpq connection string.
pub const SCHEME: &str = "etcd://";

/// etcd's own client port, for a member named without one.
const DEFAULT_PORT: u16 = 2379;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// `host:port` of each member, in the order to try them.
    pub members: Vec<String>,
    /// The keys' common start: `/PREFIX`, or empty for keys at the root (`/workers/N`).
    pub prefix: String,
    pub tls: Option<Tls>,
    pub auth: Option<Auth>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub ca_file: String,
    /// The client certificate and its key.
    pub client: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    pub user: String,
    pub password_file: String,
}

pub fn is_etcd(registry: &str) -> bool {
    registry.trim_start().starts_with(SCHEME)
}

impl Setting {
    /// Reads the setting; the error names what is wrong with it.
    pub fn parse(registry: &str) -> Result<Setting, String> {
        let rest = registry
            .trim()
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("an etcd registry starts with {SCHEME}"))?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, path) = location.split_once('/').unwrap_or((location, ""));
        // etcd://user:password@host, as other clients write it: never echoed, it may hold a secret.
        if hosts.contains('@') {
            return Err("etcd members are named HOST:PORT, with no user or password: name the user with the user option and the password's file with password_file".into());
        }
        let members = hosts
            .split(',')
            .map(member)
            .collect::<Result<Vec<_>, _>>()?;
        let prefix = path.trim_matches('/');
        if prefix
            .split('/')
            .any(|part| part.is_empty() && !prefix.is_empty())
        {
            return Err(format!("the key prefix \"{path}\" has an empty part"));
        }
        let mut options = Options::default();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("option \"{pair}\" has no value"))?;
            options.set(name, value)?;
        }
        Ok(Setting {
            members,
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("/{prefix}")
            },
            tls: options.tls()?,
            auth: options.auth()?,
        })
    }

    /// How the status and the logs name the registry: the setting holds no secret, the password
    /// being in a file.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "etcd {}, keys under {}/",
            self.members.join(","),
            self.prefix
        );
        if self.tls.is_some() {
            text.push_str(", TLS");
        }
        if let Some(auth) = &self.auth {
            text.push_str(&format!(", user \"{}\"", auth.user));
        }
        text
    }

    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

fn member(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("an etcd member is named by HOST:PORT, and one of the list is empty".into());
    }
    let (host, port) = match text.strip_prefix('[') {
        // An IPv6 address: [::1]:2379.
        Some(bracketed) => {
            let (address, after) = bracketed
                .split_once(']')
                .ok_or_else(|| format!("member \"{text}\" lacks the closing bracket"))?;
            (format!("[{address}]"), after.strip_prefix(':'))
        }
        None => match text.split_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (text.to_string(), None),
        },
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("member \"{text}\" has no valid port"))?,
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!("member \"{text}\" has no valid host"));
    }
    Ok(format!("{host}:{port}"))
}

#[derive(Default)]
struct Options {
    cacert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    user: Option<String>,
    password_file: Option<String>,
}

impl Options {
    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let slot = match name {
            "cacert" => &mut self.cacert,
            "cert" => &mut self.cert,
            "key" => &mut self.key,
            "user" => &mut self.user,
            "password_file" => &mut self.password_file,
            "password" => {
                return Err(
                    "a password is never written in snowid.registry: name a file holding it with password_file".into(),
                )
            }
            _ => {
                return Err(format!(
                    "unknown option \"{name}\" (snowid knows cacert, cert, key, user and password_file)"
                ))
            }
        };
        if value.is_empty() {
            return Err(format!("option \"{name}\" is empty"));
        }
        if slot.replace(value.to_string()).is_some() {
            return Err(format!("option \"{name}\" is given twice"));
        }
        Ok(())
    }

    fn tls(&self) -> Result<Option<Tls>, String> {
        let client = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err("options cert and key come together".into()),
        };
        match (&self.cacert, client) {
            (Some(ca_file), client) => Ok(Some(Tls {
                ca_file: ca_file.clone(),
                client,
            })),
            (None, Some(_)) => {
                Err("a client certificate needs TLS: name the members' CA with cacert".into())
            }
            (None, None) => Ok(None),
        }
    }

    fn auth(&self) -> Result<Option<Auth>, String> {
        match (&self.user, &self.password_file) {
            (Some(_), Some(_)) if self.cacert.is_none() => Err(
                "etcd's user authentication needs TLS, or the password would cross the network in the clear: name the members' CA with cacert"
                    .into(),
            ),
            (Some(user), Some(password_file)) => Ok(Some(Auth {
                user: user.clone(),
                password_file: password_file.clone(),
            })),
            (None, None) => Ok(None),
            _ => Err("options user and password_file come together".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_prefix() {
        let setting = Setting::parse("etcd://127.0.0.1:2379,db2, [::1]:2479/snowid").unwrap();
        assert_eq!(
            setting.members,
            ["127.0.0.1:2379", "db2:2379", "[::1]:2479"]
        );
        assert_eq!(setting.prefix, "/snowid");
        assert_eq!((&setting.tls, &setting.auth), (&None, &None));
        assert_eq!(setting.scheme(), "http");
        assert_eq!(Setting::parse("etcd://h:1/a/b/").unwrap().prefix, "/a/b");
        assert_eq!(Setting::parse("etcd://h:1").unwrap().prefix, "");
        assert_eq!(Setting::parse("etcd://h:1/").unwrap().prefix, "");
        assert!(is_etcd(" etcd://h"));
        assert!(!is_etcd("host=etcd://h"));
    }

    #[test]
    fn options_for_tls_and_authentication() {
        let setting = Setting::parse(
            "etcd://h:1/snowid?cacert=/etc/ca.crt&cert=/etc/n.crt&key=/etc/n.key&user=node1&password_file=/etc/pw",
        )
        .unwrap();
        assert_eq!(
            setting.tls,
            Some(Tls {
                ca_file: "/etc/ca.crt".into(),
                client: Some(("/etc/n.crt".into(), "/etc/n.key".into()))
            })
        );
        assert_eq!(
            setting.auth,
            Some(Auth {
                user: "node1".into(),
                password_file: "/etc/pw".into()
            })
        );
        assert_eq!(setting.scheme(), "https");
        assert_eq!(
            setting.describe(),
            "etcd h:1, keys under /snowid/, TLS, user \"node1\""
        );
        assert_eq!(
            Setting::parse("etcd://a:1,b:2").unwrap().describe(),
            "etcd a:1,b:2, keys under /"
        );
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        let cases = [
            ("etcd:///snowid", "an etcd member is named by HOST:PORT, and one of the list is empty"),
            ("etcd://a:1,,b:2/x", "an etcd member is named by HOST:PORT, and one of the list is empty"),
            ("etcd://a:0/x", "member \"a:0\" has no valid port"),
            ("etcd://a:b/x", "member \"a:b\" has no valid port"),
            ("etcd://:5/x", "member \":5\" has no valid host"),
            ("etcd://[::1/x", "member \"[::1\" lacks the closing bracket"),
            ("etcd://a/x//y", "the key prefix \"x//y\" has an empty part"),
            ("etcd://node1:secret@a:2379/x", "etcd members are named HOST:PORT, with no user or password: name the user with the user option and the password's file with password_file"),
            ("etcd://a/x?password=secret", "a password is never written in snowid.registry: name a file holding it with password_file"),
            ("etcd://a/x?sslmode=require", "unknown option \"sslmode\" (snowid knows cacert, cert, key, user and password_file)"),
            ("etcd://a/x?user", "option \"user\" has no value"),
            ("etcd://a/x?user=", "option \"user\" is empty"),
            ("etcd://a/x?user=a&user=b&password_file=/p", "option \"user\" is given twice"),
            ("etcd://a/x?cert=/c", "options cert and key come together"),
            ("etcd://a/x?cert=/c&key=/k", "a client certificate needs TLS: name the members' CA with cacert"),
            ("etcd://a/x?user=u", "options user and password_file come together"),
            ("etcd://10.0.0.11:2379/snowid?user=node1&password_file=/etc/pw", "etcd's user authentication needs TLS, or the password would cross the network in the clear: name the members' CA with cacert"),
            ("host=a", "an etcd registry starts with etcd://"),
        ];
        for (setting, message) in cases {
            assert_eq!(Setting::parse(setting).unwrap_err(), message, "{setting}");
        }
    }
}
