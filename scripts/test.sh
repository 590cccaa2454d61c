#!/usr/bin/env bash
# Runs every snowid test: unit and property tests, #[pg_test]s in a preloaded server, then the
# cluster tests (settings, concurrency, clock steps, SQL regression files, README examples).
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$REPO"

echo "==> unit, property and #[pg_test] tests"
pgrx_test_args=()
if is_root; then
    pgdata=/tmp/snowid-pgrx-test
    rm -rf "$pgdata" && mkdir -p "$pgdata" && chown postgres:postgres "$pgdata"
    pgrx_test_args=(--runas postgres --pgdata "$pgdata/data")
fi
cargo pgrx test pg15 "${pgrx_test_args[@]}"

install_snowid

echo "==> cluster tests"
(cd tests/cluster && PG_CONFIG="$PG_CONFIG" cargo test --release)
