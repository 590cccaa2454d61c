#!/usr/bin/env bash
# Measures snowid's throughput beside nextval() on a throwaway cluster, release build.
# Prints a Markdown table; `benches/run.sh > benches/results.md` records it.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/setup.sh"
install_snowid >&2

dir=${SNOWID_BENCH_DIR:-/tmp/snowid-bench}
port=${SNOWID_BENCH_PORT:-54339}
start_cluster "$dir" "$port" "shared_preload_libraries = 'snowid'" "snowid.worker_id = 17" >&2
trap 'stop_cluster "$dir"' EXIT
python3 "$REPO/benches/throughput.py" --psql "$("$PG_CONFIG" --bindir)/psql" --port "$port" "$@"
