"""What each primary key costs as its table outgrows shared buffers (run by growth.sh).

growth.py schemes: the schemes of a major, one per line, after checking --rows and --step.
growth.py measure: fills one scheme's table on a fresh server and writes its steps as JSON.
growth.py report: turns the schemes' JSON into growth.md (the largest step), growth-steps.md (every
step) and growth.png.

A measurement: two sessions fill a table (id, created_at, payload: 64 characters) with 1,000-row
transactions. After every --step rows it records, over that step, the rows per second, the WAL
bytes and full-page images per row (pg_stat_wal, which counts the WAL of every process), the
checkpoints and the table's autovacuums, and the share of the primary key index's block reads that
shared buffers answered (pg_statio_user_indexes), and at its end the index's and the table's sizes.
Once the table holds --rows rows, two more steps of the same size repeat the largest step; the
report quotes the median of the three and their range.

The interleaved scheme stands for the fan-in of three writers with worker ids 17, 18 and 19 into
one table: each row takes an id of this server (worker id 17) and moves it to worker id 17, 18 or
19 by its row number, which keeps the id's time and sequence, as three servers issuing at the same
moments would. On PostgreSQL 18 and later, the native uuidv7() is measured beside the others.
"""

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import subprocess
import sys
import time

SESSIONS = 2
ROWS_PER_TRANSACTION = 1000
REPEATS = 3  # the largest step, measured this many times

# Each scheme: its name in the results, how row g of a transaction gets its key, the key's type.
SCHEMES = {
    "snowid": ("snowid_next()", "snowid_next()", "bigint"),
    "bigserial": ("bigserial", "nextval('growth_sequence')", "bigint"),
    "uuid4": ("gen_random_uuid() (v4)", "gen_random_uuid()", "uuid"),
    "uuidv7": ("uuidv7() (native, 18)", "uuidv7()", "uuid"),
    "interleaved": ("snowid, 3 worker ids interleaved", "snowid_next() + (g % 3) * 4096", "bigint"),
}


def schemes_of(major):
    return [key for key in SCHEMES if key != "uuidv7" or major >= 18]


def psql(args, sql):
    command = [args.psql, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(args.port),
               "-U", "postgres", "-d", "postgres"]
    done = subprocess.run(command, input=sql, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"psql failed: {done.stderr}")
    return [line for line in done.stdout.splitlines() if line]


def counters(args, major):
    """WAL bytes, full-page images, checkpoints, the table's autovacuums, index blocks hit and read, index and
    table bytes."""
    checkpoints = ("(SELECT num_timed + num_requested FROM pg_stat_checkpointer)" if major >= 17 else
                   "(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)")
    row = psql(args, f"""
        SELECT w.wal_bytes, w.wal_fpi, {checkpoints}, coalesce(t.autovacuum_count, 0),
               coalesce(i.idx_blks_hit, 0), coalesce(i.idx_blks_read, 0),
               pg_relation_size('growth_keys_pkey'), pg_relation_size('growth_keys')
          FROM pg_stat_wal w
          LEFT JOIN pg_statio_user_indexes i ON i.indexrelname = 'growth_keys_pkey'
          LEFT JOIN pg_stat_user_tables t ON t.relname = 'growth_keys'
    """)[0].split("|")
    return [int(value) for value in row]


def fill(args, rows):
    """Inserts `rows` rows from SESSIONS sessions at once; returns the seconds it took."""
    transactions = rows // SESSIONS // ROWS_PER_TRANSACTION
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(SESSIONS) as pool:
        list(pool.map(lambda _: psql(args, f"CALL growth_fill({transactions})"), range(SESSIONS)))
    return time.monotonic() - started


def measure(args):
    major = int(psql(args, "SHOW server_version_num")[0]) // 10000
    _, expression, key_type = SCHEMES[args.scheme]
    psql(args, f"""
        CREATE EXTENSION snowid;
        SELECT snowid_wait_ready();
        CREATE SEQUENCE growth_sequence;
        CREATE TABLE growth_keys (id {key_type} PRIMARY KEY, created_at timestamptz NOT NULL, payload text NOT NULL);
        CREATE PROCEDURE growth_fill(transactions integer) LANGUAGE plpgsql AS $$
        BEGIN
            FOR t IN 1..transactions LOOP
                INSERT INTO growth_keys
                SELECT {expression}, now(), md5(g::text) || md5(random()::text)
                  FROM generate_series(1, {ROWS_PER_TRANSACTION}) g;
                COMMIT;
            END LOOP;
        END
        $$;
        CHECKPOINT;
    """)
    steps = []
    last = args.rows + (REPEATS - 1) * args.step
    for rows in range(args.step, last + 1, args.step):
        before = counters(args, major)
        seconds = fill(args, args.step)
        # The sessions' backends have exited, and a backend reports its statistics as it exits.
        after = counters(args, major)
        wal_bytes, fpi, checkpoints, autovacuums, hit, read = (after[i] - before[i] for i in range(6))
        step = {
            "rows": rows,
            "rows_per_s": args.step / seconds,
            "wal_per_row": wal_bytes / args.step,
            "fpi_per_row": fpi / args.step,
            "checkpoints": checkpoints,
            "autovacuums": autovacuums,
            "hit_ratio": hit / (hit + read) if hit + read else 1.0,
            "index_mib": after[6] / 2**20,
            "table_mib": after[7] / 2**20,
        }
        steps.append(step)
        print(f"    {rows:>12,} rows: {step['rows_per_s']:>9,.0f} rows/s, {step['wal_per_row']:6.0f} WAL bytes/row, "
              f"{step['fpi_per_row']:.3f} FPI/row, {checkpoints} checkpoints, {autovacuums} autovacuums, "
              f"index {step['index_mib']:.0f} MiB ({step['hit_ratio']:.1%} hit)", flush=True)
    version = psql(args, "SHOW server_version")[0].split(" ")[0]
    settings = psql(args, "SELECT string_agg(name || ' ' || current_setting(name), ', ' ORDER BY name) "
                          "FROM unnest(ARRAY['shared_buffers', 'max_wal_size', 'checkpoint_timeout']) name")[0]
    with open(args.out, "w") as out:
        json.dump({"scheme": args.scheme, "version": version, "settings": settings, "rows": args.rows,
                   "step": args.step, "steps": steps}, out)


def largest_step(result):
    """The REPEATS measurements of the largest step: the step to --rows and those after it."""
    return [step for step in result["steps"] if step["rows"] >= result["rows"]]


def median_and_range(values, form):
    return f"{form(statistics.median(values))} ({form(min(values))} – {form(max(values))})"


def report(args):
    results = []
    for path in args.files:
        with open(path) as file:
            results.append(json.load(file))
    first = results[0]
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    bigserial = next(result for result in results if result["scheme"] == "bigserial")
    baseline = statistics.median(step["rows_per_s"] for step in largest_step(bigserial))
    machine = (f"Machine: {os.cpu_count()} cores ({platform.machine()}), {memory_gib:.0f} GiB of memory, PostgreSQL "
               f"{first['version']}; {first['settings']}, every other setting at its default; a fresh server "
               f"for each key; {SESSIONS} sessions inserting {ROWS_PER_TRANSACTION:,}-row transactions.")
    summary = [f"{machine} At {first['rows']:,} rows: the step of {first['step']:,} rows that reaches them and "
               f"the {REPEATS - 1} after it, median (lowest – highest); sizes after the last of them.", "",
               "| primary key | rows/s | of bigserial's | WAL bytes/row | full-page images/row | checkpoints/step "
               "| index hits | index | table |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        steps = largest_step(result)
        rates = [step["rows_per_s"] for step in steps]
        summary.append(
            f"| `{SCHEMES[result['scheme']][0]}` | {median_and_range(rates, lambda v: f'{v / 1000:.0f} k')} | "
            f"{statistics.median(rates) / baseline:.0%} | "
            f"{median_and_range([step['wal_per_row'] for step in steps], lambda v: f'{v:.0f}')} | "
            f"{median_and_range([step['fpi_per_row'] for step in steps], lambda v: f'{v:.3f}')} | "
            f"{median_and_range([step['checkpoints'] for step in steps], lambda v: f'{v:.0f}')} | "
            f"{median_and_range([step['hit_ratio'] for step in steps], lambda v: f'{v:.1%}')} | "
            f"{steps[-1]['index_mib']:,.0f} MiB | {steps[-1]['table_mib']:,.0f} MiB |")
    every_step = [f"{machine} Figures over each step of {first['step']:,} rows; the last {REPEATS} are the step "
                  f"that reaches {first['rows']:,} rows and its {REPEATS - 1} repeats."]
    for result in results:
        every_step += ["", f"### `{SCHEMES[result['scheme']][0]}`", "",
                       "| rows | rows/s | WAL bytes/row | full-page images/row | checkpoints | autovacuums | index hits "
                       "| index |",
                       "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        every_step += [f"| {step['rows']:,} | {step['rows_per_s']:,.0f} | {step['wal_per_row']:.0f} | "
                       f"{step['fpi_per_row']:.3f} | {step['checkpoints']} | {step['autovacuums']} | {step['hit_ratio']:.1%} | "
                       f"{step['index_mib']:,.0f} MiB |" for step in result["steps"]]
    os.makedirs(args.out_dir, exist_ok=True)
    for name, lines in (("growth-steps.md", every_step), ("growth.md", summary)):
        text = "\n".join(lines) + "\n"
        print(text)
        with open(os.path.join(args.out_dir, name), "w") as out:
            out.write(text)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate, wal) = plt.subplots(1, 2, figsize=(13, 5))
    for result in results:
        millions = [step["rows"] / 1e6 for step in result["steps"]]
        name = SCHEMES[result["scheme"]][0]
        rate.plot(millions, [step["rows_per_s"] / 1000 for step in result["steps"]], marker=".", label=name)
        wal.plot(millions, [step["wal_per_row"] for step in result["steps"]], marker=".", label=name)
    rate.set(xlabel="rows in the table (millions)", ylabel="rows per second (thousands)",
             title="insert rate over each step")
    wal.set(xlabel="rows in the table (millions)", ylabel="WAL bytes per row", title="WAL per row over each step")
    for axes in (rate, wal):
        axes.grid(True, alpha=0.3)
        axes.set_ylim(bottom=0)
        axes.axvline(first["rows"] / 1e6, color="grey", linewidth=0.8, linestyle=":")
    rate.legend()
    figure.suptitle(f"Primary keys as the table outgrows shared buffers: PostgreSQL {first['version']}, "
                    f"{first['settings']}, {os.cpu_count()} cores")
    figure.tight_layout()
    figure.savefig(os.path.join(args.out_dir, "growth.png"), dpi=100)
    print(f"==> wrote growth.md, growth-steps.md and growth.png in {args.out_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    schemes = commands.add_parser("schemes")
    schemes.add_argument("--major", type=int, required=True)
    for command in (schemes, commands.add_parser("measure")):
        command.add_argument("--rows", type=int, required=True)
        command.add_argument("--step", type=int, required=True)
    measuring = commands.choices["measure"]
    measuring.add_argument("--scheme", choices=SCHEMES, required=True)
    measuring.add_argument("--psql", required=True)
    measuring.add_argument("--port", type=int, required=True)
    measuring.add_argument("--out", required=True)
    reporting = commands.add_parser("report")
    reporting.add_argument("--out-dir", required=True)
    reporting.add_argument("files", nargs="+")
    args = parser.parse_args()
    if args.command == "report":
        report(args)
        return
    unit = SESSIONS * ROWS_PER_TRANSACTION
    if args.step <= 0 or args.step % unit or args.rows < args.step or args.rows % args.step:
        sys.exit(f"growth: --step must be a positive multiple of {unit:,} and --rows a multiple of --step "
                 f"(got --rows {args.rows:,} --step {args.step:,})")
    if args.command == "schemes":
        print("\n".join(schemes_of(args.major)))
    else:
        measure(args)


main()
