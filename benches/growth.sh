#!/usr/bin/env bash
# What each primary key costs as its table outgrows shared buffers, on the major that PG_MAJOR
# picks, release build. For each key, a fresh throwaway server (shared_buffers 128MB unless
# --shared-buffers says otherwise, max_wal_size 1GB, checkpoint_timeout 1min, every other setting
# at its default) and a table filled to --rows rows (default 20,000,000), figures every --step rows
# (default 1,000,000). Writes growth.md, growth-steps.md and growth.png in benches/results/pgMAJOR
# (or --out-dir) and prints them.
set -euo pipefail
rows=20000000 step=1000000 shared_buffers=128MB out_dir=
usage="usage: benches/growth.sh [--rows N] [--step N] [--shared-buffers SIZE] [--out-dir DIR]"
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
    case $1 in
        --rows) rows=$2 ;;
        --step) step=$2 ;;
        --shared-buffers) shared_buffers=$2 ;;
        --out-dir) out_dir=$2 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
    shift 2
done
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/setup.sh"
growth=(python3 "$REPO/benches/growth.py")
major=$PG_MAJOR
schemes=$("${growth[@]}" schemes --major "$major" --rows "$rows" --step "$step")
if ! python3 -c 'import matplotlib' 2>/dev/null; then
    echo "==> installing matplotlib for the chart" >&2
    python3 -m pip install --quiet matplotlib 2>/dev/null || as_root apt-get install -y -qq python3-matplotlib >&2
fi
install_snowid >&2

dir=${SNOWID_BENCH_DIR:-/tmp/snowid-growth}
port=${SNOWID_BENCH_PORT:-54340}
steps=$(mktemp -d)
trap 'stop_cluster "$dir"; rm -rf "$steps"' EXIT
files=()
for scheme in $schemes; do
    # The build's and the last scheme's writes reach the disk now, not during the next measurement.
    sync
    echo "==> $scheme: a fresh server with shared_buffers $shared_buffers on port $port"
    start_cluster "$dir" "$port" "shared_preload_libraries = 'snowid'" "snowid.worker_id = 17" \
        "shared_buffers = '$shared_buffers'" "max_wal_size = '1GB'" "checkpoint_timeout = '1min'" ||
        { tail -n 3 "$dir/server.log" >&2; exit 1; }
    "${growth[@]}" measure --scheme "$scheme" --rows "$rows" --step "$step" \
        --psql "$("$PG_CONFIG" --bindir)/psql" --port "$port" --out "$steps/$scheme.json"
    stop_cluster "$dir"
    files+=("$steps/$scheme.json")
done
"${growth[@]}" report --out-dir "${out_dir:-$REPO/benches/results/pg$major}" "${files[@]}"
