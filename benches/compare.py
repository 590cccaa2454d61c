"""What one id costs, for benches/compare.sh: two builds of snowid beside PostgreSQL's own ways.

snowid issues at most 4,096 ids per millisecond, and a loop of bare snowid_next() calls reaches that
cap: its rate then says nothing of what a call costs. So every expression is timed inside a loop
whose rows carry other work (an md5 of the row number), slow enough to stay below the cap, and the
cost of one id is the loop's time with the expression less its time without it, over the rows.

measure: on a running server, times each loop once, in an order that turns with the round, and
prints one JSON line per loop; a server in a registry mode other than the lease table times the bare
loop and snowid_next() only. sessions: on a running server, the ids per second of every expression
but the bare loop with 1, 2 and 4 concurrent sessions, by pgbench: each session runs a statement
that makes SESSION_IDS ids, for --seconds; the figure is pgbench's transactions per second (all
sessions together) times SESSION_IDS, and at the cap snowid cannot pass it. One JSON line per
figure. report: the median cost per id of every expression for each build, the spread of the
rounds, and the difference between the builds; with registry modes, snowid_next() in each mode
beside the lease table's; from the samples of sessions, the median ids per second of each
expression and number of sessions for each build, and each as a share of snowid's cap.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import helpers

CAP = 4_096_000  # ids per second per server
# The row's own work, and what each row adds to it: NULL tests cost the same whatever they test.
LOOP = (
    "SELECT count(hashtext(i::text) + CASE WHEN {} IS NULL THEN 0 ELSE 1 END) "
    "FROM generate_series(1, {}) i"
)
EXPRESSIONS = {
    "no call (the loop alone)": "i",
    "snowid_next()": "snowid_next()",
    "nextval(), plain sequence": "nextval('compare_plain')",
    "nextval(), CACHE 1000": "nextval('compare_cached')",
    "gen_random_uuid()": "gen_random_uuid()",
}
BARE = "no call (the loop alone)"
LEASE_TABLE = "lease-table"
REPEATS = 3
SESSIONS = (1, 2, 4)
SESSION_IDS = 10_000  # ids per pgbench transaction
SESSION_STATEMENT = "SELECT count({}) FROM generate_series(1, {});\n"
SET_UP = """
CREATE SEQUENCE compare_plain;
CREATE SEQUENCE compare_cached CACHE 1000;
CREATE FUNCTION compare_seconds(query text) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE started timestamptz := clock_timestamp();
BEGIN
    EXECUTE query;
    RETURN extract(epoch FROM clock_timestamp() - started);
END $$;
"""


def psql(args, sql):
    result = subprocess.run(
        [args.psql, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
         "-p", str(args.port), "-U", "postgres", "-d", "postgres", "-c", sql],
        capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"compare.py: {sql.strip()[:60]}...: {result.stderr.strip()}")
    return result.stdout.strip()


def set_up(args):
    """The extension ready to issue and the sequences made; returns the server's version."""
    # Committed before the wait: the lease worker looks for the extension from its own session.
    psql(args, "CREATE EXTENSION snowid")
    if psql(args, "SELECT snowid_wait_ready()") != "t":
        sys.exit("compare.py: the server did not hold its lease within 30 s")
    psql(args, SET_UP)
    return psql(args, "SHOW server_version").split()[0]


def in_turn(names, round):
    """The names in an order that turns with the round, so that no expression always goes first."""
    return names[round % len(names):] + names[:round % len(names)]


def spread(values):
    """The median of the values, their lowest and their highest."""
    return statistics.median(values), min(values), max(values)


def measure(args):
    version = set_up(args)
    names = in_turn(list(EXPRESSIONS) if args.mode == LEASE_TABLE else [BARE, "snowid_next()"],
                    args.round)
    # A warm-up of every loop, so that the first timed one does not pay for loading code.
    for name in names:
        psql(args, LOOP.format(EXPRESSIONS[name], 10_000))
    timings = {name: [] for name in names}
    for _ in range(REPEATS):
        for name in names:
            query = LOOP.format(EXPRESSIONS[name], args.ids).replace("'", "''")
            timings[name].append(float(psql(args, f"SELECT compare_seconds('{query}')")))
    for name in names:
        fastest = min(timings[name])
        if name == "snowid_next()" and args.ids / fastest > 0.8 * CAP:
            sys.exit(f"compare.py: the snowid loop ran at {args.ids / fastest:,.0f} ids/s, near "
                     f"the cap of {CAP:,}: the cap would hide the cost of a call")
        print(json.dumps({"build": args.build, "mode": args.mode, "expression": name,
                          "seconds": fastest, "server_version": version}))


def ns_per_id(samples, build, name, ids, mode=LEASE_TABLE):
    """The median over rounds of the expression's time less the bare loop's, per row, with the
    lowest and highest round."""
    ours = [s for s in samples if s["build"] == build and s["mode"] == mode]
    times = [s["seconds"] for s in ours if s["expression"] == name]
    bare = [s["seconds"] for s in ours if s["expression"] == BARE]
    return spread([(t - b) / ids * 1e9 for t, b in zip(times, bare)])


def sessions(args):
    version = set_up(args)
    pgbench = os.path.join(os.path.dirname(args.psql), "pgbench")
    if not os.access(pgbench, os.X_OK):
        sys.exit(f"compare.py: no pgbench beside {args.psql}")
    for name in in_turn([name for name in EXPRESSIONS if name != BARE], args.round):
        statement = SESSION_STATEMENT.format(EXPRESSIONS[name], SESSION_IDS)
        psql(args, statement)  # a warm-up, so that the first figure does not pay for loading code
        for count in SESSIONS:
            with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
                script.write(statement)
                script.flush()
                done = subprocess.run(
                    [pgbench, "-n", "-M", "prepared", "-c", str(count), "-j", str(count),
                     "-T", str(args.seconds), "-f", script.name, "-h", "127.0.0.1",
                     "-p", str(args.port), "-U", "postgres", "postgres"],
                    capture_output=True, text=True)
            tps = re.search(r"^tps = ([0-9.]+)", done.stdout, re.MULTILINE)
            if done.returncode != 0 or not tps:
                sys.exit(f"compare.py: pgbench, {name}, {count} sessions: "
                         f"{(done.stderr or done.stdout).strip()}")
            print(json.dumps({"build": args.build, "mode": LEASE_TABLE, "expression": name,
                              "sessions": count, "ids_per_second": float(tps[1]) * SESSION_IDS,
                              "seconds": args.seconds, "server_version": version}))


def heading(samples, rounds, what):
    """The first line of a report: the machine, the server, the date and how the run went."""
    return (f"Machine: {helpers.machine()}; PostgreSQL {samples[0]['server_version']}; "
            f"{datetime.date.today():%Y-%m-%d}; {rounds} round{'s' if rounds > 1 else ''}, "
            f"the builds installed in turn, each round on a fresh server; {what}.")


def report(args):
    samples = [{"mode": LEASE_TABLE, **json.loads(line)} for path in args.samples
               for line in open(path)]
    if "sessions" in samples[0]:
        return report_sessions(samples, args.out)
    builds = list(dict.fromkeys(s["build"] for s in samples))
    modes = list(dict.fromkeys(s["mode"] for s in samples))
    rounds = sum(1 for s in samples if s["build"] == builds[0] and s["expression"] == BARE
                 and s["mode"] == LEASE_TABLE)
    lines = [
        heading(samples, rounds, f"{args.ids:,} rows per loop"),
        "",
        "### Nanoseconds per id: the loop's time with the call less its time without it",
        "",
        "| expression | " + " | ".join(builds) + " |",
        "|---|" + "---:|" * len(builds),
    ]
    for name in EXPRESSIONS:
        cells = []
        for build in builds:
            if name == BARE:
                bare = [s["seconds"] for s in samples if s["build"] == build
                        and s["expression"] == BARE and s["mode"] == LEASE_TABLE]
                cells.append(f"{statistics.median(bare) / args.ids * 1e9:.1f} per row")
            else:
                median, low, high = ns_per_id(samples, build, name, args.ids)
                cells.append(f"{median:.1f} ({low:.1f} – {high:.1f})")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    if len(builds) == 2:
        before, after = (ns_per_id(samples, b, "snowid_next()", args.ids) for b in builds)
        spread = max(before[2] - before[1], after[2] - after[1])
        lines += [
            "",
            f"snowid_next(): {after[0] - before[0]:+.1f} ns per id from {builds[0]} to "
            f"{builds[1]} ({(after[0] - before[0]) / before[0]:+.1%}); the rounds of one build "
            f"spread over up to {spread:.1f} ns.",
        ]
    if len(modes) > 1:
        lines += registry_modes(samples, builds, modes, args.ids)
    write(lines, args.out)


def write(lines, path):
    text = "\n".join(lines) + "\n"
    with open(path, "w") as out:
        out.write(text)
    print(text)


def ids_per_second(samples, build, name, count):
    """The median over rounds of the ids per second of `count` sessions, the lowest and highest."""
    return spread([s["ids_per_second"] for s in samples if s["build"] == build
                   and s["expression"] == name and s["sessions"] == count])


def report_sessions(samples, path):
    builds = list(dict.fromkeys(s["build"] for s in samples))
    names = [name for name in EXPRESSIONS if any(s["expression"] == name for s in samples)]
    rounds = sum(1 for s in samples if s["build"] == builds[0] and s["expression"] == names[0]
                 and s["sessions"] == SESSIONS[0])
    lines = [
        heading(samples, rounds, f"pgbench, {samples[0]['seconds']} s per figure, each session "
                f"running `{SESSION_STATEMENT.format('f()', SESSION_IDS).strip()}`: "
                f"ids per second are transactions per second times {SESSION_IDS:,}"),
        "",
        f"### Ids per second, all sessions together: median, share of snowid's cap of {CAP:,} "
        "(lowest – highest round)",
        "",
        "| expression | sessions | " + " | ".join(builds) + " |",
        "|---|---:|" + "---:|" * len(builds),
    ]
    for name in names:
        for count in SESSIONS:
            cells = []
            for build in builds:
                median, low, high = ids_per_second(samples, build, name, count)
                cells.append(f"{median / 1e6:.2f} M, {median / CAP:.1%} "
                             f"({low / 1e6:.2f} – {high / 1e6:.2f})")
            lines.append(f"| `{name}` | {count} | " + " | ".join(cells) + " |")
    if len(builds) == 2:
        lines.append("")
        for count in SESSIONS:
            before, after = (ids_per_second(samples, b, "snowid_next()", count) for b in builds)
            width = max(before[2] - before[1], after[2] - after[1])
            lines.append(f"- snowid_next(), {count} session{'s' if count > 1 else ''}: "
                         f"{before[0] / CAP:.1%} of the cap with {builds[0]}, {after[0] / CAP:.1%} "
                         f"with {builds[1]} ({(after[0] - before[0]) / CAP * 100:+.1f} points); "
                         f"the rounds of one build spread over up to {width / CAP * 100:.1f} points")
    write(lines, path)


def registry_modes(samples, builds, modes, ids):
    """snowid_next() in each registry mode, each beside the lease table's, the spread of whose
    rounds says what a difference is worth."""
    lines = [
        "",
        "### snowid_next() in each registry mode: nanoseconds per id, median (lowest – highest round)",
        "",
        "| mode | " + " | ".join(builds) + " |",
        "|---|" + "---:|" * len(builds),
    ]
    for mode in modes:
        cells = ["{:.1f} ({:.1f} – {:.1f})".format(*ns_per_id(samples, b, "snowid_next()", ids, mode))
                 for b in builds]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines.append("")
    for build in builds:
        base, low, high = ns_per_id(samples, build, "snowid_next()", ids)
        spread = high - low
        for mode in modes[1:]:
            cost = ns_per_id(samples, build, "snowid_next()", ids, mode)[0]
            verdict = "within" if abs(cost - base) <= spread else "outside"
            lines.append(f"- {build}, {mode}: {cost - base:+.1f} ns per id from {LEASE_TABLE}, "
                         f"{verdict} the {spread:.1f} ns over which {LEASE_TABLE}'s rounds spread")
    return lines


def main():
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    server = argparse.ArgumentParser(add_help=False)  # what both ways of measuring are told
    server.add_argument("--build", required=True)
    server.add_argument("--round", type=int, required=True)
    server.add_argument("--psql", required=True)
    server.add_argument("--port", type=int, required=True)
    run = commands.add_parser("measure", parents=[server])
    run.add_argument("--mode", default=LEASE_TABLE)
    run.add_argument("--ids", type=int, required=True)
    commands.add_parser("sessions", parents=[server]).add_argument("--seconds", type=int, required=True)
    out = commands.add_parser("report")
    out.add_argument("--ids", type=int, required=True)
    out.add_argument("--out", required=True)
    out.add_argument("samples", nargs="+")
    args = parser.parse_args()
    {"measure": measure, "sessions": sessions, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
