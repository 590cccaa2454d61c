"""What one id costs, for benches/compare.sh: two builds of snowid beside PostgreSQL's own ways.

snowid issues at most 4,096 ids per millisecond, and a loop of bare snowid_next() calls reaches that
cap: its rate then says nothing of what a call costs. So every expression is timed inside a loop
whose rows carry other work (an md5 of the row number), slow enough to stay below the cap, and the
cost of one id is the loop's time with the expression less its time without it, over the rows.

measure: on a running server, times each loop once, in an order that turns with the round, and
prints one JSON line per loop; a server in a registry mode other than the lease table times the bare
loop and snowid_next() only. report: the median cost per id of every expression for each build,
the spread of the rounds, and the difference between the builds; with registry modes, snowid_next()
in each mode beside the lease table's.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

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


def measure(args):
    # Committed before the wait: the lease worker looks for the extension from its own session.
    psql(args, "CREATE EXTENSION snowid")
    if psql(args, "SELECT snowid_wait_ready()") != "t":
        sys.exit("compare.py: the server did not hold its lease within 30 s")
    psql(args, SET_UP)
    version = psql(args, "SHOW server_version").split()[0]
    names = list(EXPRESSIONS) if args.mode == LEASE_TABLE else [BARE, "snowid_next()"]
    names = names[args.round % len(names):] + names[:args.round % len(names)]
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
    costs = [(t - b) / ids * 1e9 for t, b in zip(times, bare)]
    return statistics.median(costs), min(costs), max(costs)


def report(args):
    samples = [{"mode": LEASE_TABLE, **json.loads(line)} for path in args.samples
               for line in open(path)]
    builds = list(dict.fromkeys(s["build"] for s in samples))
    modes = list(dict.fromkeys(s["mode"] for s in samples))
    rounds = sum(1 for s in samples if s["build"] == builds[0] and s["expression"] == BARE
                 and s["mode"] == LEASE_TABLE)
    lines = [
        f"Machine: {os.cpu_count()} cores ({platform.machine()}), PostgreSQL "
        f"{samples[0]['server_version']}; {rounds} rounds, "
        f"the builds installed in turn, each round on a fresh server; {args.ids:,} rows per loop.",
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
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as out:
        out.write(text)
    print(text)


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
    run = commands.add_parser("measure")
    run.add_argument("--build", required=True)
    run.add_argument("--mode", default=LEASE_TABLE)
    run.add_argument("--round", type=int, required=True)
    run.add_argument("--ids", type=int, required=True)
    run.add_argument("--psql", required=True)
    run.add_argument("--port", type=int, required=True)
    out = commands.add_parser("report")
    out.add_argument("--ids", type=int, required=True)
    out.add_argument("--out", required=True)
    out.add_argument("samples", nargs="+")
    args = parser.parse_args()
    measure(args) if args.command == "measure" else report(args)


if __name__ == "__main__":
    main()
