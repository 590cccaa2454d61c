"""What each primary key costs as its table outgrows shared buffers (run by growth.sh).

growth.py schemes: the schemes of a major, one per line.
growth.py measure: fills one scheme's table on a fresh server and writes its steps as JSON.
growth.py report: turns the schemes' JSON into growth.md (the largest size), growth-steps.md (every
step), growth.png and growth.json (all of it).

A measurement: two sessions fill a table (id, created_at, payload: 64 characters) with 1,000-row
transactions. The table is not autovacuumed: a vacuum's WAL would fall into whichever steps it ran
in (on 18, whose initdb turns data checksums on, an image of every heap page), and only the slow
keys' vacuums would finish inside their runs. After every --step rows it records, over that step,
the rows per second, the WAL per row (by the WAL insert position), the full-page images per row
(pg_stat_wal), the checkpoints, and the primary key index's block reads and the share of its block
requests that shared buffers answered (pg_statio_user_indexes); and at its end the index's and the
table's sizes. Once the table holds --rows rows, it goes on for two more steps of the same size:
the report quotes the median and range of those three steps.

The interleaved scheme stands for the fan-in of three writers with worker ids 17, 18 and 19 into
one table: each row takes an id of this server (worker id 17) and adds 0, 1 or 2 to its worker id
field (bits 12 to 21, hence 4096) by its row number, which keeps the id's time and sequence, as
three servers issuing at the same moments would. On PostgreSQL 18 and later, the native uuidv7()
is measured beside the others.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import sys

import helpers
import time

SESSIONS = 2
ROWS_PER_TRANSACTION = 1000
LAST_STEPS = 3  # the step that reaches --rows and those after it, quoted together
SETTINGS = ["shared_buffers", "max_wal_size", "checkpoint_timeout", "data_checksums", "full_page_writes",
            "wal_compression", "synchronous_commit"]

# Each scheme: its name in the results, how row g of a transaction gets its key, the key's type,
# and its colour in the chart.
SCHEMES = {
    "snowid": ("snowid_next()", "snowid_next()", "bigint", "tab:blue"),
    "bigserial": ("bigserial", "nextval('growth_sequence')", "bigint", "tab:orange"),
    "uuid4": ("gen_random_uuid() (v4)", "gen_random_uuid()", "uuid", "tab:green"),
    "uuidv7": ("uuidv7() (native, 18)", "uuidv7()", "uuid", "tab:red"),
    "interleaved": ("snowid, 3 worker ids interleaved", "snowid_next() + (g % 3) * 4096", "bigint", "tab:purple"),
}


def psql(args, sql):
    return [line for line in helpers.psql(args.psql, args.port, sql) if line]


def counters(args, major):
    checkpoints = ("(SELECT num_timed + num_requested FROM pg_stat_checkpointer)" if major >= 17 else
                   "(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)")
    values = psql(args, f"""
        SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, w.wal_fpi, {checkpoints},
               coalesce(i.idx_blks_hit, 0), coalesce(i.idx_blks_read, 0),
               pg_relation_size('growth_keys_pkey'), pg_relation_size('growth_keys')
          FROM pg_stat_wal w
          LEFT JOIN pg_statio_user_indexes i ON i.indexrelname = 'growth_keys_pkey'
    """)[0].split("|")
    names = ["wal_bytes", "fpi", "checkpoints", "index_hits", "index_reads", "index_bytes", "table_bytes"]
    return dict(zip(names, map(int, values)))


def fill(args, rows):
    """Inserts `rows` rows from SESSIONS sessions at once; returns the seconds it took."""
    transactions = rows // SESSIONS // ROWS_PER_TRANSACTION
    # The flush makes each session's statistics visible before its psql returns.
    sql = f"CALL growth_fill({transactions}); SELECT pg_stat_force_next_flush();"
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(SESSIONS) as pool:
        list(pool.map(lambda _: psql(args, sql), range(SESSIONS)))
    return time.monotonic() - started


def measure(args):
    major = int(psql(args, "SHOW server_version_num")[0]) // 10000
    _, expression, key_type, _ = SCHEMES[args.scheme]
    psql(args, f"""
        CREATE EXTENSION snowid;
        SELECT snowid_wait_ready();
        CREATE SEQUENCE growth_sequence;
        CREATE TABLE growth_keys (id {key_type} PRIMARY KEY, created_at timestamptz NOT NULL, payload text NOT NULL)
            WITH (autovacuum_enabled = off);
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
    for rows in range(args.step, args.rows + (LAST_STEPS - 1) * args.step + 1, args.step):
        before = counters(args, major)
        seconds = fill(args, args.step)
        after = counters(args, major)
        change = {name: after[name] - before[name] for name in after}
        requests = change["index_hits"] + change["index_reads"]
        step = {
            "rows": rows,
            "rows_per_s": args.step / seconds,
            "wal_per_row": change["wal_bytes"] / args.step,
            "fpi_per_row": change["fpi"] / args.step,
            "checkpoints": change["checkpoints"],
            "index_reads_per_row": change["index_reads"] / args.step,
            "hit_ratio": change["index_hits"] / requests if requests else 1.0,
            "index_mib": after["index_bytes"] / 2**20,
            "table_mib": after["table_bytes"] / 2**20,
        }
        steps.append(step)
        print(f"    {rows:>12,} rows: {step['rows_per_s']:>9,.0f} rows/s, {step['wal_per_row']:6.0f} WAL bytes/row, "
              f"{step['fpi_per_row']:.3f} FPI/row, {step['checkpoints']} checkpoints, "
              f"index {step['index_mib']:.0f} MiB ({step['hit_ratio']:.1%} hit)",
              flush=True)
    version = psql(args, "SHOW server_version")[0].split(" ")[0]
    settings = ", ".join(f"{name} {value}" for name, value in
                         zip(SETTINGS, psql(args, "\n".join(f"SHOW {name};" for name in SETTINGS))))
    with open(args.out, "w") as out:
        json.dump({"scheme": args.scheme, "version": version, "settings": settings, "rows": args.rows,
                   "step": args.step, "steps": steps}, out)


def last_steps(result):
    return [step for step in result["steps"] if step["rows"] >= result["rows"]]


def median_and_range(values, form):
    return f"{form(statistics.median(values))} ({form(min(values))} – {form(max(values))})"


def report(args):
    results = []
    for path in args.files:
        with open(path) as file:
            results.append(json.load(file))
    first = results[0]
    rows, step_rows = first["rows"], first["step"]
    bigserial = next(result for result in results if result["scheme"] == "bigserial")
    baseline = statistics.median(step["rows_per_s"] for step in last_steps(bigserial))
    setup = (f"Machine: {helpers.machine()}, the data directory on {args.storage}. PostgreSQL {first['version']}: "
             f"{first['settings']}, every other setting at its default; a fresh server for each key; "
             f"{SESSIONS} sessions inserting {ROWS_PER_TRANSACTION:,}-row transactions into a table created "
             "WITH (autovacuum_enabled = off).")
    ends = [f"{rows + k * step_rows:,}" for k in range(LAST_STEPS)]
    summary = [f"{setup} At {rows:,} rows: the steps of {step_rows:,} rows to {', '.join(ends[:-1])} and "
               f"{ends[-1]} rows, median (lowest – highest); sizes at {rows:,} rows.",
               "", "| primary key | rows/s | of bigserial's | WAL bytes/row | full-page images/row "
               "| checkpoints/step | index hits | index | table |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        steps = last_steps(result)
        rates = [step["rows_per_s"] for step in steps]
        summary.append(
            f"| `{SCHEMES[result['scheme']][0]}` | {median_and_range(rates, lambda v: f'{v / 1000:.0f} k')} | "
            f"{statistics.median(rates) / baseline:.0%} | "
            f"{median_and_range([step['wal_per_row'] for step in steps], lambda v: f'{v:,.0f}')} | "
            f"{median_and_range([step['fpi_per_row'] for step in steps], lambda v: f'{v:.3f}')} | "
            f"{median_and_range([step['checkpoints'] for step in steps], lambda v: f'{v:.0f}')} | "
            f"{median_and_range([step['hit_ratio'] for step in steps], lambda v: f'{v:.1%}')} | "
            f"{steps[0]['index_mib']:,.0f} MiB | {steps[0]['table_mib']:,.0f} MiB |")
    every_step = [f"{setup} Figures over each step of {step_rows:,} rows; the last {LAST_STEPS} steps are those "
                  "that growth.md quotes."]
    for result in results:
        every_step += ["", f"### `{SCHEMES[result['scheme']][0]}`", "",
                       "| rows | rows/s | WAL bytes/row | full-page images/row | checkpoints | index reads/row "
                       "| index hits | index | table |",
                       "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        every_step += [f"| {step['rows']:,} | {step['rows_per_s']:,.0f} | {step['wal_per_row']:,.0f} | "
                       f"{step['fpi_per_row']:.3f} | {step['checkpoints']} | {step['index_reads_per_row']:.3f} | {step['hit_ratio']:.1%} | "
                       f"{step['index_mib']:,.0f} MiB | {step['table_mib']:,.0f} MiB |" for step in result["steps"]]
    os.makedirs(args.out_dir, exist_ok=True)
    for name, lines in (("growth-steps.md", every_step), ("growth.md", summary)):
        text = "\n".join(lines) + "\n"
        print(text)
        with open(os.path.join(args.out_dir, name), "w") as out:
            out.write(text)
    with open(os.path.join(args.out_dir, "growth.json"), "w") as out:
        json.dump({"setup": setup, "results": results}, out, indent=1)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate, wal) = plt.subplots(1, 2, figsize=(13, 5))
    for result in results:
        millions = [step["rows"] / 1e6 for step in result["steps"]]
        name, _, _, colour = SCHEMES[result["scheme"]]
        rate.plot(millions, [step["rows_per_s"] / 1000 for step in result["steps"]], marker=".", label=name,
                  color=colour)
        wal.plot(millions, [step["wal_per_row"] for step in result["steps"]], marker=".", label=name, color=colour)
    rate.set(xlabel="rows in the table (millions)", ylabel="rows per second (thousands)",
             title="insert rate over each step")
    wal.set(xlabel="rows in the table (millions)", ylabel="WAL bytes per row", title="WAL per row over each step")
    for axes in (rate, wal):
        axes.grid(True, alpha=0.3)
        axes.set_ylim(bottom=0)
        axes.axvline(rows / 1e6, color="grey", linewidth=0.8, linestyle=":")
    rate.legend()
    settings = ", ".join(first["settings"].split(", ")[:3])
    figure.suptitle(f"Primary keys as the table outgrows shared buffers: PostgreSQL {first['version']}, "
                    f"{settings}, {os.cpu_count()} cores")
    figure.tight_layout()
    figure.savefig(os.path.join(args.out_dir, "growth.png"), dpi=100)
    print(f"==> wrote growth.md, growth-steps.md, growth.json and growth.png in {args.out_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("schemes")
    listing.add_argument("--major", type=int, required=True)
    measuring = commands.add_parser("measure")
    measuring.add_argument("--scheme", choices=SCHEMES, required=True)
    measuring.add_argument("--rows", type=int, required=True)
    measuring.add_argument("--step", type=int, required=True)
    measuring.add_argument("--psql", required=True)
    measuring.add_argument("--port", type=int, required=True)
    measuring.add_argument("--out", required=True)
    reporting = commands.add_parser("report")
    reporting.add_argument("--out-dir", required=True)
    reporting.add_argument("--storage", required=True)
    reporting.add_argument("files", nargs="+")
    args = parser.parse_args()
    if args.command == "schemes":
        print("\n".join(key for key in SCHEMES if key != "uuidv7" or args.major >= 18))
    elif args.command == "measure":
        measure(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
