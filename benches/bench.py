"""snowid beside PostgreSQL's own ways of making keys, measured in one run on running servers.

1. Ids per second in an in-server loop, with the generator in the target list of
   `SELECT count(f()) FROM (SELECT generate_series(1, n)) s` so that nothing is materialised first,
   for 1, 2 and 4 concurrent sessions that all start at the same instant (pg_sleep_until). The rate is
   all ids over the time from the earliest start to the latest end, by the server's clock.
2. Inserts of --rows rows into a table whose primary key uses each scheme: time, rows per second,
   and the primary key index's size after the load.
3. The latency of one snowid_next() while 4 sessions make ids at once: p50, p99 and max.
4. Scale-out: ids per second of 1, 2 and 3 servers with distinct worker ids, one session each.

On PostgreSQL 18 and later, the native uuidv7() is measured beside them. Every figure is the median
of --runs runs; the spread is the lowest and highest run. Results go to
benches/results/pgMAJOR/results.md and benches/results/pgMAJOR/chart.png.
"""

import argparse
import concurrent.futures
import datetime
import os
import platform
import statistics
import sys

import helpers

CAP = 4_096_000  # ids per second per server: 4,096 sequence numbers in every millisecond
MAX_BATCH = 4_096_000
HERE = os.path.dirname(os.path.abspath(__file__))

# The schemes compared: how each makes one key in SQL, and its key type.
SCHEMES = {
    "snowid_next()": ("snowid_next()", "bigint"),
    "snowid_next_batch()": (None, "bigint"),
    "nextval(), plain sequence (bigserial)": ("nextval('bench_plain')", "bigint"),
    "nextval(), CACHE 1000": ("nextval('bench_cached')", "bigint"),
    "gen_random_uuid() (v4)": ("gen_random_uuid()", "uuid"),
    "UUID v7 in SQL": ("bench_uuid_v7()", "uuid"),
    "PL/pgSQL Snowflake": ("bench_plpgsql_snowflake()", "bigint"),
}

SETUP_SQL = """
CREATE EXTENSION IF NOT EXISTS snowid;
DROP SEQUENCE IF EXISTS bench_plain, bench_cached, bench_snowflake;
CREATE SEQUENCE bench_plain;
CREATE SEQUENCE bench_cached CACHE 1000;
CREATE SEQUENCE bench_snowflake;
-- UUID v7 the way PostgreSQL 15 users write it: 48 bits of Unix milliseconds, the version digit,
-- then the random bits (and variant) of a v4 UUID.
CREATE OR REPLACE FUNCTION bench_uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
            || '7' || substr(r, 14, 3) || substr(r, 17, 16))::uuid
      FROM (SELECT replace(gen_random_uuid()::text, '-', '') AS r) random
$$;
-- The widely copied PL/pgSQL Snowflake: milliseconds, a shard id, and nextval() % 1024.
CREATE OR REPLACE FUNCTION bench_plpgsql_snowflake(OUT id bigint) LANGUAGE plpgsql AS $$
DECLARE
    epoch_ms bigint := 1767225600000;
    shard_id int := 5;
    now_ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000);
BEGIN
    id := (now_ms - epoch_ms) << 23 | shard_id << 10 | nextval('bench_snowflake') % 1024;
END
$$;
"""

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--psql", default="psql")
parser.add_argument("--ports", required=True, help="comma-separated ports of up to 3 servers, each preloading snowid with its own worker id")
parser.add_argument("--rows", type=int, default=5_000_000, help="rows per insert run")
parser.add_argument("--runs", type=int, default=3, help="runs per figure; the median is shown")
parser.add_argument("--seconds", type=float, default=2.0, help="about how long one throughput run lasts")
args = parser.parse_args()
ports = [int(port) for port in args.ports.split(",")]


def psql(sql, port=None):
    return helpers.psql(args.psql, port or ports[0], sql)


def count_query(scheme, ids):
    if scheme == "snowid_next_batch()":
        calls = -(-ids // MAX_BATCH)
        return f"SELECT count(id) FROM (SELECT snowid_next_batch({-(-ids // calls)}) id FROM generate_series(1, {calls})) s"
    return f"SELECT count({SCHEMES[scheme][0]}) FROM (SELECT generate_series(1, {ids})) s"


def concurrent_rate(jobs):
    """Runs (port, query) jobs at one instant; returns all rows counted over the whole span."""
    start = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)).isoformat()
    def session(job):
        port, query = job
        out = psql(f"SELECT pg_sleep_until('{start}');\nSELECT extract(epoch FROM clock_timestamp());\n"
                   f"{query};\nSELECT extract(epoch FROM clock_timestamp());\n", port)
        return float(out[1]), int(out[2]), float(out[3])
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(session, jobs))
    return sum(count for _, count, _ in results) / (max(end for *_, end in results) - min(begin for begin, *_ in results))


def ids_per_run(scheme):
    """Enough ids for a run of about --seconds, from a short trial."""
    if scheme.startswith("snowid"):
        return int(CAP * args.seconds) // 4096 * 4096
    trial = 200_000
    rate = concurrent_rate([(ports[0], count_query(scheme, trial))])
    return max(trial, int(rate * args.seconds) // 1000 * 1000)


def median_and_spread(measure):
    values = [measure() for _ in range(args.runs)]
    return statistics.median(values), min(values), max(values)


def millions(value):
    return f"{value / 1e6:.2f} M"


def throughput():
    results = {}
    for scheme in SCHEMES:
        ids = ids_per_run(scheme)
        for sessions in (1, 2, 4):
            query = count_query(scheme, ids // sessions)
            results[scheme, sessions] = median_and_spread(lambda: concurrent_rate([(ports[0], query)] * sessions))
            print(f"  {scheme}, {sessions} sessions: {millions(results[scheme, sessions][0])} ids/s", file=sys.stderr)
    return results


def inserts():
    results = {}
    for scheme, (expression, key_type) in SCHEMES.items():
        if expression is None:
            continue
        def load():
            out = psql(f"""
DROP TABLE IF EXISTS bench_keys;
CREATE TABLE bench_keys (id {key_type} PRIMARY KEY DEFAULT {expression}, payload int);
CHECKPOINT;
SELECT extract(epoch FROM clock_timestamp());
INSERT INTO bench_keys (payload) SELECT n FROM generate_series(1, {args.rows}) n;
SELECT extract(epoch FROM clock_timestamp());
SELECT pg_relation_size('bench_keys_pkey');
""")
            values = [line for line in out if line]
            begin, end, index_bytes = float(values[0]), float(values[1]), int(values[2])
            return end - begin, index_bytes
        runs = [load() for _ in range(args.runs)]
        seconds = [run[0] for run in runs]
        results[scheme] = (statistics.median(seconds), min(seconds), max(seconds), runs[0][1])
        print(f"  {scheme}: {statistics.median(seconds):.1f} s for {args.rows:,} rows", file=sys.stderr)
    psql("DROP TABLE IF EXISTS bench_keys;")
    return results


def latency():
    """p50, p99 and max of one snowid_next(), in microseconds, with 4 sessions making ids."""
    query = ("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY us), percentile_cont(0.99) WITHIN GROUP (ORDER BY us), max(us) "
             "FROM (SELECT extract(epoch FROM after - before) * 1e6 AS us FROM "
             "(SELECT clock_timestamp() AS before, snowid_next() AS id, clock_timestamp() AS after "
             f"FROM (SELECT generate_series(1, {CAP // 4})) s) calls) latencies")
    def run():
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            rows = list(pool.map(lambda _: psql(query)[0].split("|"), range(4)))
        values = [[float(value) for value in row] for row in rows]
        return statistics.median(v[0] for v in values), max(v[1] for v in values), max(v[2] for v in values)
    runs = [run() for _ in range(args.runs)]
    return tuple(statistics.median(run[i] for run in runs) for i in range(3))


def scale_out():
    results = {}
    for servers in range(1, len(ports) + 1):
        jobs = [(port, count_query("snowid_next()", int(CAP * args.seconds))) for port in ports[:servers]]
        results[servers] = median_and_spread(lambda: concurrent_rate(jobs))
        print(f"  {servers} servers: {millions(results[servers][0])} ids/s", file=sys.stderr)
    return results


def ids_ahead_of_the_clock(ids=1_000_000):
    """Ids whose time part is later than the server's clock right after they were issued."""
    checks = ["SELECT count(*) FILTER (WHERE snowid_timestamp(id) > issued_by) FROM (SELECT snowid_next() AS id, "
              f"clock_timestamp() AS issued_by FROM (SELECT generate_series(1, {ids})) s) q",
              "SELECT count(*) FILTER (WHERE snowid_timestamp(id) > clock_timestamp()) FROM "
              f"(SELECT snowid_next_batch({ids}) AS id) s"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(lambda i: psql(checks[i % 2]), range(4)))
    return sum(int(out[0]) for out in outputs), 4 * ids


def chart(rates, loads, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(SCHEMES)
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 6))
    width = 0.27
    for offset, sessions in enumerate((1, 2, 4)):
        left.barh([i + (offset - 1) * width for i in range(len(names))],
                  [rates[name, sessions][0] / 1e6 for name in names], width, label=f"{sessions} session{'s' if sessions > 1 else ''}")
    left.axvline(CAP / 1e6, color="grey", linestyle="--", label="snowid's cap per server")
    left.set_yticks(range(len(names)), names)
    left.invert_yaxis()
    left.set_xlabel("million ids per second (in-server loop)")
    left.legend(loc="lower right")
    loaded = [name for name in names if name in loads]
    right.barh(range(len(loaded)), [args.rows / loads[name][0] / 1e3 for name in loaded], color="tab:green")
    right.set_yticks(range(len(loaded)), [f"{name}\nindex {loads[name][3] / 2**20:.0f} MiB" for name in loaded])
    right.invert_yaxis()
    right.set_xlabel(f"thousand rows per second, inserting {args.rows:,} rows")
    figure.suptitle(f"snowid beside PostgreSQL's alternatives — {os.cpu_count()} cores, PostgreSQL {server_version}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


try:
    import matplotlib  # noqa: F401
except ImportError:
    sys.exit("the chart needs matplotlib: apt-get install python3-matplotlib, or pip install matplotlib")
if len(ports) < 1:
    sys.exit("--ports names no server")
for port in ports:
    psql(SETUP_SQL, port)
    if psql("SELECT snowid_wait_ready()", port)[0] != "t":
        sys.exit(f"snowid on port {port} was not ready to issue within 30 s: see snowid_status()")
server_version = psql("SHOW server_version")[0].split(" ")[0]
major = int(psql("SHOW server_version_num")[0]) // 10000
if major >= 18:
    # The strongest peer: PostgreSQL 18's own UUID v7, in C.
    SCHEMES["uuidv7() (native, PostgreSQL 18)"] = ("uuidv7()", "uuid")

print("ids per second...", file=sys.stderr)
rates = throughput()
print("inserts...", file=sys.stderr)
loads = inserts()
print("latency...", file=sys.stderr)
p50, p99, worst = latency()
print("scale-out...", file=sys.stderr)
servers = scale_out()
ahead, checked = ids_ahead_of_the_clock()

lines = [f"Machine: {os.cpu_count()} cores ({platform.machine()}), PostgreSQL {server_version}; "
         f"median of {args.runs} runs, spread in brackets (lowest – highest).", "",
         "### Ids per second, in-server loop", "",
         "| scheme | 1 session | 2 sessions | 4 sessions | % of snowid's cap (1 / 2 / 4) |", "|---|---:|---:|---:|---|"]
for scheme in SCHEMES:
    cells = [f"{millions(rates[scheme, s][0])} ({rates[scheme, s][1] / 1e6:.2f} – {rates[scheme, s][2] / 1e6:.2f})" for s in (1, 2, 4)]
    share = " / ".join(f"{100 * rates[scheme, s][0] / CAP:.1f}%" for s in (1, 2, 4)) if scheme.startswith("snowid") else "–"
    lines.append(f"| `{scheme}` | " + " | ".join(cells) + f" | {share} |")
lines += ["", f"Ids ahead of the server's clock when issued: {ahead} of {checked:,} checked "
          "(4 sessions, snowid_next() and snowid_next_batch()).", "",
          f"### Inserting {args.rows:,} rows", "",
          "| primary key | time | rows/s | primary key index |", "|---|---:|---:|---:|"]
for scheme, (seconds, low, high, index_bytes) in loads.items():
    lines.append(f"| `{scheme}` | {seconds:.1f} s ({low:.1f} – {high:.1f}) | {args.rows / seconds / 1e3:.0f} k | "
                 f"{index_bytes / 2**20:.0f} MiB |")
lines += ["", "### Latency of one snowid_next() with 4 sessions issuing", "",
          f"p50 {p50:.1f} µs, p99 {p99:.1f} µs, max {worst:.0f} µs (median over runs; p99 and max are the "
          "highest of the 4 sessions).", "",
          "### Scale-out: servers with distinct worker ids, one session each", "",
          "| servers | ids/s |", "|---:|---:|"]
for count, (median, low, high) in servers.items():
    lines.append(f"| {count} | {millions(median)} ({low / 1e6:.2f} – {high / 1e6:.2f}) |")
lines += ["", f"This machine has {os.cpu_count()} cores: each session keeps one busy, so beyond "
          f"{os.cpu_count()} servers the sessions share the cores and the aggregate cannot grow. "
          "On a fleet every server has its own cores and its own cap of 4,096,000 ids/s."]

results_dir = os.path.join(HERE, "results", f"pg{major}")
os.makedirs(results_dir, exist_ok=True)
with open(os.path.join(results_dir, "results.md"), "w") as results_file:
    results_file.write("\n".join(lines) + "\n")
chart(rates, loads, os.path.join(results_dir, "chart.png"))
print("\n".join(lines))
