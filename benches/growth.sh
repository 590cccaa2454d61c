#!/usr/bin/env bash
# What each primary key costs as its table outgrows shared buffers, on the major that PG_MAJOR
# picks, release build. For each key, a fresh throwaway server (shared_buffers 128MB, max_wal_size
# 1GB, checkpoint_timeout 1min, every other setting at its default) and a table, not autovacuumed,
# filled to --rows rows and two steps beyond, with figures every --step rows. Writes growth.md,
# growth-steps.md, growth.json and growth.png in benches/results/pgMAJOR (or --out-dir) and prints
# them.
set -euo pipefail
rows=20000000 step=1000000 shared_buffers=128MB max_wal_size=1GB out_dir=
usage="usage: benches/growth.sh [--rows N] [--step N] [--shared-buffers SIZE] [--max-wal-size SIZE] [--out-dir DIR]
  --rows: the size the figures are quoted at (default 20000000), a multiple of --step;
          each table goes on for two more steps
  --step: rows between two records (default 1000000), a multiple of 2000
  sizes: a number and a unit of kB, MB, GB (defaults 128MB and 1GB)"
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
read_options "$usage" --rows=rows --step=step --shared-buffers=shared_buffers \
    --max-wal-size=max_wal_size --out-dir=out_dir -- "$@"
[[ $step =~ ^[1-9][0-9]*$ && $((step % 2000)) = 0 ]] || usage_error "$usage" "--step $step is not a positive multiple of 2000"
[[ $rows =~ ^[1-9][0-9]*$ && $((rows % step)) = 0 ]] || usage_error "$usage" "--rows $rows is not a positive multiple of --step"
for size in "$shared_buffers" "$max_wal_size"; do
    [[ $size =~ ^[1-9][0-9]*(kB|MB|GB)$ ]] || usage_error "$usage" "$size is not a size such as 128MB"
done

prepare build
growth=(python3 "$REPO/benches/growth.py")
install_matplotlib
install_snowid >&2

dir=${SNOWID_GROWTH_DIR:-/tmp/snowid-growth}
port=${SNOWID_GROWTH_PORT:-54360}
mkdir -p "$dir"
storage=$(findmnt --noheadings --output SOURCE,FSTYPE --target "$dir" | awk '{print $1 " (" $2 ")"}')
steps=$(mktemp -d)
echo "==> each key's figures go to $steps"
trap 'stop_cluster "$dir"' EXIT
files=()
for scheme in $("${growth[@]}" schemes --major "$PG_MAJOR"); do
    # The build's and the last key's writes reach the disk now, not during the next measurement.
    sync
    echo "==> $scheme: a fresh server with shared_buffers $shared_buffers and max_wal_size $max_wal_size on port $port"
    start_cluster "$dir" "$port" "shared_preload_libraries = 'snowid'" "snowid.worker_id = 17" \
        "shared_buffers = '$shared_buffers'" "max_wal_size = '$max_wal_size'" "checkpoint_timeout = '1min'" ||
        { tail -n 3 "$dir/server.log" >&2; exit 1; }
    "${growth[@]}" measure --scheme "$scheme" --rows "$rows" --step "$step" \
        --psql "$("$PG_CONFIG" --bindir)/psql" --port "$port" --out "$steps/$scheme.json"
    stop_cluster "$dir"
    rm -rf "$dir/data"
    files+=("$steps/$scheme.json")
done
"${growth[@]}" report --out-dir "${out_dir:-$REPO/benches/results/pg$PG_MAJOR}" --storage "$storage" "${files[@]}"
rm -rf "$steps"
