"""Ids per second from snowid_next(), snowid_next_batch() and nextval() on a plain sequence, for 1, 2
and 4 concurrent sessions, against a running server with snowid preloaded.

Every session waits for the same start instant (pg_sleep_until), then makes its share of the ids in
one statement with the function in the target list, so nothing is materialised first. The aggregate
rate is all ids over the time from the earliest start to the latest end, as the server's clock saw
them. Each figure is the median of several runs; the spread is the lowest and highest run.
"""

import argparse
import concurrent.futures
import datetime
import os
import platform
import statistics
import subprocess

CAP = 4_096_000  # ids per second per server: 4,096 sequence numbers in every millisecond
MAX_BATCH = 4_096_000

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--psql", default="psql")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--ids", type=int, default=2 * CAP, help="ids per measured run, over all sessions")
parser.add_argument("--runs", type=int, default=5, help="runs per figure; the median is shown")
args = parser.parse_args()


def psql(sql):
    command = [args.psql, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(args.port),
               "-U", "postgres", "-d", "postgres"]
    done = subprocess.run(command, input=sql, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"psql failed: {done.stderr.strip()}")
    return done.stdout.split("\n")


def per_session_query(function, ids):
    if function == "snowid_next_batch()":
        calls = -(-ids // MAX_BATCH)
        assert ids % calls == 0
        return f"SELECT count(id) FROM (SELECT snowid_next_batch({ids // calls}) id FROM generate_series(1, {calls})) s"
    call = {"snowid_next()": "snowid_next()", "nextval()": "nextval('bench_sequence')"}[function]
    return f"SELECT count({call}) FROM (SELECT generate_series(1, {ids})) s"


def one_run(function, sessions):
    share = args.ids // sessions
    start = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)).isoformat()
    script = (f"SELECT pg_sleep_until('{start}');\n"
              "SELECT extract(epoch FROM clock_timestamp());\n"
              f"{per_session_query(function, share)};\n"
              "SELECT extract(epoch FROM clock_timestamp());\n")
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        outputs = list(pool.map(lambda _: psql(script), range(sessions)))
    begins, counts, ends = zip(*[(float(out[1]), int(out[2]), float(out[3])) for out in outputs])
    assert sum(counts) == share * sessions
    return sum(counts) / (max(ends) - min(begins))


def ids_ahead_of_the_clock(sessions=4, ids=1_000_000):
    """Ids whose time part is later than the server's clock right after they were issued."""
    checks = ["SELECT count(*) FILTER (WHERE snowid_timestamp(id) > issued_by) FROM "
              f"(SELECT snowid_next() AS id, clock_timestamp() AS issued_by FROM (SELECT generate_series(1, {ids})) s) q",
              "SELECT count(*) FILTER (WHERE snowid_timestamp(id) > clock_timestamp()) FROM "
              f"(SELECT snowid_next_batch({ids}) AS id) s"]
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        outputs = list(pool.map(lambda i: psql(checks[i % 2]), range(sessions)))
    return sum(int(out[0]) for out in outputs), sessions * ids


psql("CREATE EXTENSION IF NOT EXISTS snowid; DROP SEQUENCE IF EXISTS bench_sequence; CREATE SEQUENCE bench_sequence;")
psql("DO $$ BEGIN FOR attempt IN 1..300 LOOP EXIT WHEN (SELECT lease_state FROM snowid_status()) = 'held'; "
     "PERFORM pg_sleep(0.05); END LOOP; END $$;")
version = psql("SHOW server_version")[0]
print(f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
      f"PostgreSQL {version}; {args.ids:,} ids per run, median of {args.runs} runs.\n")
print("| function | sessions | ids/s (median) | % of snowid's cap | spread (min – max) |")
print("|---|---:|---:|---:|---|")
for function in ["snowid_next()", "snowid_next_batch()", "nextval()"]:
    for sessions in [1, 2, 4]:
        rates = [one_run(function, sessions) for _ in range(args.runs)]
        median = statistics.median(rates)
        share = f"{100 * median / CAP:.1f}%" if function.startswith("snowid") else "–"
        print(f"| `{function}` | {sessions} | {median / 1e6:.2f} M | {share} | "
              f"{min(rates) / 1e6:.2f} – {max(rates) / 1e6:.2f} M |", flush=True)
ahead, checked = ids_ahead_of_the_clock()
print(f"\nIds ahead of the server's clock when issued: {ahead} of {checked:,} checked "
      "(4 sessions, snowid_next() and snowid_next_batch()).")
