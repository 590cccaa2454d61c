#!/usr/bin/env bash
# Runs every snowid test: unit and property tests, #[pg_test]s in a preloaded server, then the
# cluster tests (settings, concurrency, clock steps, copies, the fleet and etcd registries, SQL regression
# files, README examples) on PostgreSQL 15, 17 and 18, and the Debian packages (installed on 15).
# PG_MAJOR=15, 17 or 18 tests that major alone.
requested=${PG_MAJOR:-}
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$REPO"

# test_package MAJOR: the Debian package holds the library, the control file and every install and
# upgrade script, and no runpath. On 15, which Debian 12 has, it also replaces the files cargo pgrx
# installed, passes the regression files, and leaves nothing behind once removed.
test_package() {
    local major=$1 deb contents
    echo "==> PostgreSQL $major: the Debian package"
    deb=$(scripts/package.sh "$major" | tail -n 1)
    contents=$(dpkg-deb -c "$deb")
    for file in "lib/postgresql/$major/lib/snowid.so" "postgresql/$major/extension/snowid.control" \
        "postgresql/$major/extension/snowid--0.1.0.sql" "postgresql/$major/extension/snowid--0.5.0--0.6.0.sql" \
        "lib/postgresql/$major/bin/snowid-on-role-change" \
        "postgresql/$major/contrib/snowid/prometheus/queries.yaml" \
        "postgresql/$major/contrib/snowid/prometheus/snowid-alerts.yml"; do
        grep -q "$file\$" <<<"$contents" || { echo "$deb lacks $file" >&2; return 1; }
    done
    local library
    library=$(mktemp)
    dpkg-deb --fsys-tarfile "$deb" | tar -xO --wildcards '*/snowid.so' >"$library"
    if readelf -d "$library" | grep -q RUNPATH; then
        echo "$deb records a runpath" >&2
        return 1
    fi
    rm -f "$library"
    [ "$major" = 15 ] || return 0
    local apt=(as_root env DEBIAN_FRONTEND=noninteractive apt-get -y -qq)
    if dpkg -s postgresql-15-snowid >/dev/null 2>&1; then "${apt[@]}" remove postgresql-15-snowid >/dev/null; fi
    as_root rm -f "$("$PG_CONFIG" --pkglibdir)/snowid.so" "$("$PG_CONFIG" --sharedir)"/extension/snowid[.-]*
    "${apt[@]}" install "./$deb" >/dev/null
    local status=0
    (cd tests/cluster && PG_CONFIG="$PG_CONFIG" cargo test --release --test regress) || status=$?
    "${apt[@]}" remove postgresql-15-snowid >/dev/null
    [ "$status" = 0 ] || return "$status"
    local left
    left=$(ls "$("$PG_CONFIG" --pkglibdir)"/snowid* "$("$PG_CONFIG" --sharedir)"/extension/snowid* 2>/dev/null || true)
    [ -z "$left" ] || { echo "apt-get remove left files behind: $left" >&2; return 1; }
    echo "==> the package installed, passed the regression files and was removed without a trace"
    install_snowid
}

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

    test_package "$major"
done
