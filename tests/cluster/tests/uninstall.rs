//! Uninstalling snowid as docs/install.md's "Uninstalling" says, step by step, its SQL run as the
//! page writes it: a server with the lease table, a table owned by an application role into which a
//! writer role inserts, and a trigger function that calls `snowid_next()`; a node of a shared
//! registry; and a third server left preloading snowid, which then no longer starts. The Debian
//! package is removed. scripts/test.sh runs it on 15 once it has installed the package, never
//! beside other tests (nextest's profiles leave it out): it removes the files they use.

use postgres::Client;
use snowid_cluster_tests::{
    as_root_command, pg_config, query_pair, query_value, Cluster, NEW_REGISTRY,
};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGE: &str = "postgresql-15-snowid";

/// The ```sql blocks of docs/install.md's section "Uninstalling", in order.
fn uninstall_sql() -> Vec<String> {
    let page =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/install.md"))
            .unwrap();
    let start = page
        .find("\n## Uninstalling\n")
        .expect("docs/install.md has a section \"Uninstalling\"");
    let section = page[start + 1..].split("\n## ").next().unwrap();
    let mut blocks = vec![];
    let mut block: Option<String> = None;
    for line in section.lines().map(str::trim_start) {
        match (block.as_mut(), line) {
            (None, "```sql") => block = Some(String::new()),
            (Some(_), "```") => blocks.extend(block.take()),
            (Some(text), line) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// The page's SQL, by what each block does.
struct Steps {
    list_columns: String,
    list_functions: String,
    give_identity: String,
    drop_extension: String,
    list_settings: String,
}

fn package_installed() -> bool {
    let output = Command::new("dpkg-query")
        .args(["-W", "-f", "${Status}", PACKAGE])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout) == "install ok installed"
}

fn postgresql_conf(cluster: &Cluster) -> PathBuf {
    cluster.dir().join("data").join("postgresql.conf")
}

/// Adds `settings` to the server's postgresql.conf, where an operator keeps them, and restarts it.
fn configure(cluster: &Cluster, settings: &[&str]) {
    let conf = postgresql_conf(cluster);
    let mut text = fs::read_to_string(&conf).unwrap();
    for setting in settings {
        text.push_str(setting);
        text.push('\n');
    }
    fs::write(&conf, text).unwrap();
    cluster.restart();
}

/// A database `app` with snowid and a table `orders` of 100 rows keyed by `snowid_next()`, owned
/// by the role `shop`, into which the role `clerk` inserts; the ids.
fn make_orders(cluster: &Cluster) -> Vec<i64> {
    let mut admin = cluster.connect();
    admin.batch_execute("CREATE DATABASE app").unwrap();
    admin
        .batch_execute("CREATE ROLE shop; CREATE ROLE clerk")
        .unwrap();
    let mut app = cluster.connect_to("app");
    app.batch_execute(
        "CREATE EXTENSION snowid;
         SELECT snowid_wait_ready('30 seconds');
         CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text);
         ALTER TABLE orders OWNER TO shop;
         GRANT SELECT, INSERT ON orders TO clerk;
         SET ROLE clerk;
         INSERT INTO orders (item) SELECT 'item ' || n FROM generate_series(1, 100) n;
         RESET ROLE",
    )
    .unwrap();
    ids(&mut app)
}

fn ids(app: &mut Client) -> Vec<i64> {
    app.query("SELECT id FROM orders ORDER BY id", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The rows of one of the page's listing queries, each as the text of a record: `(orders,id)`.
fn listed(client: &mut Client, query: &str) -> Vec<String> {
    let query = format!(
        "SELECT listed::text FROM ({}) AS listed",
        query.trim().trim_end_matches(';')
    );
    client
        .query(&query, &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Steps 1 and 2 in the database `app`: the column and the function listed and replaced, and the
/// extension dropped, which fails before.
fn take_snowid_out_of_app(cluster: &Cluster, steps: &Steps) {
    let mut app = cluster.connect_to("app");
    let refused = app.batch_execute(&steps.drop_extension).unwrap_err();
    let error = refused.as_db_error().unwrap();
    assert_eq!(
        error.message(),
        "cannot drop extension snowid because other objects depend on it"
    );
    assert_eq!(
        error.detail(),
        Some("default value for column id of table orders depends on function snowid_next()")
    );
    assert_eq!(listed(&mut app, &steps.list_columns), ["(orders,id)"]);
    app.batch_execute(&steps.give_identity).unwrap();
    assert_eq!(listed(&mut app, &steps.list_columns), Vec::<String>::new());
    if !listed(&mut app, &steps.list_functions).is_empty() {
        assert_eq!(listed(&mut app, &steps.list_functions), ["(\"stamp()\")"]);
        app.batch_execute("DROP FUNCTION stamp()").unwrap();
        assert_eq!(
            listed(&mut app, &steps.list_functions),
            Vec::<String>::new()
        );
    }
    app.batch_execute(&steps.drop_extension).unwrap();
}

/// Step 3: every `snowid.` line and the preload out of postgresql.conf, checked with the page's
/// query before the restart, and after it.
fn unconfigure(cluster: &Cluster, steps: &Steps) {
    let conf = postgresql_conf(cluster);
    let kept: String = fs::read_to_string(&conf)
        .unwrap()
        .lines()
        .filter(|line| {
            !line.starts_with("snowid.") && *line != "shared_preload_libraries = 'snowid'"
        })
        .map(|line| format!("{line}\n"))
        .collect();
    fs::write(&conf, kept).unwrap();
    assert_eq!(
        listed(&mut cluster.connect(), &steps.list_settings),
        Vec::<String>::new()
    );
    cluster.restart();
    let preloaded: String = query_value(&mut cluster.connect(), "SHOW shared_preload_libraries");
    assert_eq!(preloaded, "");
}

fn snowid_files(data: &Path) -> Vec<String> {
    let mut files: Vec<String> = fs::read_dir(data)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("snowid"))
        .collect();
    files.sort();
    files
}

/// After the package is gone: the server starts without snowid and keeps every id, and the writer
/// role's next row takes its id from the identity, above them.
fn assert_intact(cluster: &Cluster, before: &[i64]) {
    cluster.restart();
    let mut app = cluster.connect_to("app");
    assert_eq!(ids(&mut app), before);
    app.batch_execute("SET ROLE clerk").unwrap();
    let next: i64 = query_value(
        &mut app,
        "INSERT INTO orders (item) VALUES ('after') RETURNING id",
    );
    assert_eq!(next, before.last().unwrap() + 1);
}

#[test]
fn following_the_uninstall_steps_leaves_servers_that_start_with_every_row_and_no_snowid_file() {
    assert!(
        package_installed(),
        "{PACKAGE} is not installed: scripts/test.sh runs this test once it has installed the package"
    );
    let blocks = uninstall_sql();
    let [list_columns, list_functions, give_identity, drop_extension, list_settings] =
        <[String; 5]>::try_from(blocks.clone()).unwrap_or_else(|_| {
            panic!("five SQL blocks in docs/install.md's Uninstalling: {blocks:?}")
        });
    let steps = Steps {
        list_columns,
        list_functions,
        give_identity,
        drop_extension,
        list_settings,
    };

    let registry = Cluster::start("uninstall-registry", &[]);
    registry.connect().batch_execute(NEW_REGISTRY).unwrap();
    let alone = Cluster::start("uninstall-alone", &[]);
    let node = Cluster::start("uninstall-node", &[]);
    let stays = Cluster::start("uninstall-stays", &[]);
    configure(
        &alone,
        &[
            "shared_preload_libraries = 'snowid'",
            "snowid.worker_id = 3",
        ],
    );
    let registry_setting = format!(
        "snowid.registry = 'host=127.0.0.1 port={} dbname=postgres user=postgres'",
        registry.port
    );
    configure(
        &node,
        &[
            "shared_preload_libraries = 'snowid'",
            "snowid.worker_id = 4",
            &registry_setting,
        ],
    );
    configure(
        &stays,
        &[
            "shared_preload_libraries = 'snowid'",
            "snowid.worker_id = 5",
        ],
    );
    for server in [&alone, &node] {
        server
            .connect()
            .batch_execute("CREATE EXTENSION snowid")
            .unwrap();
    }
    let alone_ids = make_orders(&alone);
    let node_ids = make_orders(&node);
    assert_eq!((alone_ids.len(), node_ids.len()), (100, 100));
    alone
        .connect_to("app")
        .batch_execute(
            "CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN NEW.id := snowid_next(); RETURN NEW; END $$",
        )
        .unwrap();
    alone
        .connect()
        .batch_execute("ALTER SYSTEM SET snowid.lease_ttl = 20")
        .unwrap();

    // Steps 1 and 2: the columns and functions, then the extension, the lease database last.
    for server in [&alone, &node] {
        take_snowid_out_of_app(server, &steps);
        server
            .connect()
            .batch_execute(&steps.drop_extension)
            .unwrap();
    }

    // Step 3: settings made with ALTER SYSTEM reset while snowid is loaded, then the files.
    alone
        .connect()
        .batch_execute("ALTER SYSTEM RESET snowid.lease_ttl")
        .unwrap();
    unconfigure(&alone, &steps);
    unconfigure(&node, &steps);
    // The node's shutdown released its lease on the registry.
    let released: (bool, bool) = query_pair(
        &mut registry.connect(),
        "SELECT holder IS NULL, released_by IS NOT NULL FROM snowid.worker_lease WHERE worker_id = 4",
    );
    assert_eq!(released, (true, true));
    // The registry, once no server uses it any more.
    registry
        .connect()
        .batch_execute(&steps.drop_extension)
        .unwrap();

    // Step 4: the ceiling, kept with the lease table on the server only.
    let alone_data = alone.dir().join("data");
    assert_eq!(snowid_files(&alone_data), ["snowid.ceiling"]);
    fs::remove_file(alone_data.join("snowid.ceiling")).unwrap();
    assert_eq!(snowid_files(&node.dir().join("data")), Vec::<String>::new());

    // Step 5: the package.
    let removed = as_root_command("apt-get")
        .args(["-y", "-qq", "remove", PACKAGE])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap();
    assert!(removed.status.success(), "{removed:?}");
    assert!(!package_installed());
    assert!(!Path::new(&pg_config("--pkglibdir"))
        .join("snowid.so")
        .exists());

    assert_intact(&alone, &alone_ids);
    assert_intact(&node, &node_ids);
    assert_eq!(snowid_files(&alone_data), Vec::<String>::new());

    // A server that still preloads snowid does not start without the package.
    stays.stop("fast");
    let failed = stays.try_start_again().unwrap_err();
    let log = stays.log();
    assert!(
        log.contains("could not access file \"snowid\": No such file or directory"),
        "{failed}\n{log}"
    );
}
