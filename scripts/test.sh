#!/usr/bin/env bash
# Runs every snowid test: unit and property tests, #[pg_test]s in a preloaded server, then the
# cluster tests (settings, concurrency, clock steps, copies, the fleet registry, SQL regression
# files, README examples) on PostgreSQL 15 and 18, and the Debian package on 15. PG_MAJOR=15 or
# PG_MAJOR=18 tests that major alone.
requested=${PG_MAJOR:-}
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$REPO"

for major in ${requested:-${MAJORS[*]}}; do
    use_major "$major"
    echo "==> PostgreSQL $major: unit, property and #[pg_test] tests"
    pgrx_test_args=()
    if is_root; then
        pgdata=/tmp/snowid-pgrx-test-$major
        rm -rf "$pgdata" && mkdir -p "$pgdata" && chown postgres:postgres "$pgdata"
        pgrx_test_args=(--runas postgres --pgdata "$pgdata/data")
    fi
    cargo pgrx test "pg$major" "${pgrx_test_args[@]}"

    install_snowid
    echo "==> PostgreSQL $major: cluster tests"
    (cd tests/cluster && PG_CONFIG="$PG_CONFIG" cargo test --release)

    if [ "$major" = 15 ]; then
        echo "==> PostgreSQL 15: the Debian package, in place of the files cargo pgrx installed"
        scripts/package.sh 15
        files=("$("$PG_CONFIG" --pkglibdir)/snowid.so" "$("$PG_CONFIG" --sharedir)"/extension/snowid[.-]*)
        as_root rm -f "${files[@]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ./dist/postgresql-15-snowid_*_amd64.deb >/dev/null
        (cd tests/cluster && PG_CONFIG="$PG_CONFIG" cargo test --release --test regress)
        as_root env DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq postgresql-15-snowid >/dev/null
        left=$(ls "$("$PG_CONFIG" --pkglibdir)"/snowid* "$("$PG_CONFIG" --sharedir)"/extension/snowid* 2>/dev/null || true)
        [ -z "$left" ] || { echo "apt-get remove left files behind: $left" >&2; exit 1; }
        echo "==> the package installed, passed the regression files and was removed without a trace"
    fi
done
