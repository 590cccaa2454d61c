#!/usr/bin/env bash
# snowid beside PostgreSQL's alternatives, on three throwaway servers (worker ids 17, 18 and 19),
# release build. Writes benches/results/pgMAJOR/results.md and chart.png and prints the
# table. Arguments go to bench.py: --rows N (default 5,000,000), --runs N (default 3). PG_MAJOR=16
# or PG_MAJOR=17 measures PostgreSQL 16 or 17; PG_MAJOR=18 measures 18, with its native uuidv7()
# beside the others.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
prepare build
install_matplotlib
install_snowid >&2

base=${SNOWID_BENCH_DIR:-/tmp/snowid-bench}
ports=()
for worker_id in 17 18 19; do
    port=$((54322 + worker_id))
    echo "==> starting a server with worker id $worker_id on port $port" >&2
    start_cluster "$base-$worker_id" "$port" "shared_preload_libraries = 'snowid'" \
        "snowid.worker_id = $worker_id" "shared_buffers = '512MB'" "max_wal_size = '4GB'"
    ports+=("$port")
done
trap 'for worker_id in 17 18 19; do stop_cluster "$base-$worker_id"; done' EXIT
python3 "$REPO/benches/bench.py" --psql "$("$PG_CONFIG" --bindir)/psql" --ports "$(IFS=,; echo "${ports[*]}")" "$@"
