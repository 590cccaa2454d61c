#!/usr/bin/env bash
# scripts/test.sh [--all-majors]
#
# Without an argument: every snowid test on one PostgreSQL major, 15 (the one Debian 12 ships) unless
# PG_MAJOR names another: the decisions' crate with its model checker (core/), the unit and
# property tests and the #[pg_test]s (cargo pgrx test), the
# cluster tests (tests/cluster, side by side under cargo-nextest's default profile), and the Debian
# package (on 15 also installed, tested and removed), and two runs of the fault schedule
# (scripts/nemesis.sh): one from a fixed seed with a PostgreSQL registry, one from a seed drawn at
# random with etcd.
#
# --all-majors, as CI runs it: the same on 15, then on every other major the tier that differs by
# major: every unit test and #[pg_test], the cluster tests of nextest's per-major profile (which
# names them and says why, in tests/cluster/.config/nextest.toml), and the package.
#
# It starts by removing what a killed run of its own left (scripts/leftovers.sh). Every run ends,
# passed or failed, with where its time went: each step's time and count of tests per major, and
# the slowest cluster tests (scripts/timings.py).
set -euo pipefail

usage="usage: scripts/test.sh [--all-majors]"
all_majors=false
case "$*" in
"") ;;
--all-majors) all_majors=true ;;
*) echo "$usage" >&2; exit 2 ;;
esac
if $all_majors && [ -n "${PG_MAJOR:-}" ]; then
    echo "scripts/test.sh: --all-majors tests every major; unset PG_MAJOR" >&2
    exit 2
fi

scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
times=$(dirname "$scripts")/target/test-times
rm -rf "$times"
mkdir -p "$times"

# timed MAJOR STEP COMMAND...: runs COMMAND as the step STEP of MAJOR. Each step's time goes to
# $times/steps.tsv when it ends, or at exit when it failed.
timed() {
    step=("$1" "$2" "$SECONDS")
    shift 2
    "$@"
    end_step
}
end_step() {
    [ ${#step[@]} = 3 ] || return 0
    printf '%s\t%s\t%s\n' "${step[0]}" "${step[1]}" "$((SECONDS - step[2]))" >>"$times/steps.tsv"
    step=()
}
step=("${PG_MAJOR:-15}" set-up "$SECONDS")
# The builds fault_schedules starts beside the schedules, while they run.
background_builds=
# A run that ends early leaves no build behind to hold cargo's lock (end_processes, of
# scripts/leftovers.sh); the report never changes the run's exit status.
trap 'if [ -n "$background_builds" ]; then end_processes "$background_builds"; fi
    end_step; python3 "$scripts/timings.py" "$times" || true' EXIT

source "$scripts/lib.sh"
source "$scripts/leftovers.sh"
prepare test
step[0]=$PG_MAJOR
end_step
cd "$REPO"
remove_leftovers

# unit_and_pg_tests MAJOR: the unit and property tests and the #[pg_test]s, in a server that
# preloads snowid; the output is kept for the count of tests.
unit_and_pg_tests() {
    local major=$1 args=()
    echo "==> PostgreSQL $major: unit, property and #[pg_test] tests"
    if is_root; then
        local pgdata=/tmp/snowid-pgrx-test-$major
        # A killed run's server there would keep the port cargo pgrx test wants.
        if [ -f "$pgdata/data/postmaster.pid" ]; then
            kill -CONT "$(head -n 1 "$pgdata/data/postmaster.pid")" 2>/dev/null || true
            as_cluster_owner "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$pgdata/data" -m immediate -w stop \
                >/dev/null 2>&1 || true
        fi
        rm -rf "$pgdata" && mkdir -p "$pgdata" && chown postgres:postgres "$pgdata"
        args=(--runas postgres --pgdata "$pgdata/data")
    fi
    cargo pgrx test "pg$major" "${args[@]}" 2>&1 | tee "$times/pgrx-$major.log"
}

# core_tests: the decisions' own crate, which has no PostgreSQL in it (core/): its unit and
# property tests, and the model checker's bounded runs (core/tests/model.rs), each printing its
# bound, the states it explored and its depth, and the trace of each known defect it finds. The
# same on every major, so run with the first one only.
core_tests() {
    echo "==> the decisions (core/): unit and property tests, and the model checker"
    cargo test -p snowid-core --release --features known-defects -- --nocapture 2>&1 |
        tee "$times/core.log"
}

# cluster_tests MAJOR PROFILE: the cluster tests of nextest's PROFILE against the installed snowid;
# their JUnit report is kept for the times of each test.
cluster_tests() {
    local major=$1 profile=$2 status=0 report=tests/cluster/target/nextest/$2/junit.xml
    echo "==> PostgreSQL $major: cluster tests (nextest profile $profile)"
    rm -f "$report"
    (cd tests/cluster && PG_CONFIG="$PG_CONFIG" cargo nextest run --release --profile "$profile") || status=$?
    if [ -f "$report" ]; then cp "$report" "$times/junit-$major.xml"; fi
    return "$status"
}

# test_package MAJOR: the Debian package holds the library, the control file, every install and
# upgrade script and the copyright file, which carries LICENSE's terms; its control names the
# maintainers; no runpath. On 15, which Debian 12 has, it also replaces the files cargo pgrx
# installed, passes the regression files, and is uninstalled as docs/install.md says
# (tests/cluster/tests/uninstall.rs), leaving nothing behind.
test_package() {
    local major=$1 deb contents latest_upgrade
    echo "==> PostgreSQL $major: the Debian package"
    deb=$(scripts/package.sh "$major" | tail -n 1)
    contents=$(dpkg-deb -c "$deb")
    latest_upgrade=$(basename "$(ls sql/snowid--*--*.sql | sort -V | tail -n 1)")
    for file in "lib/postgresql/$major/lib/snowid.so" "postgresql/$major/extension/snowid.control" \
        "postgresql/$major/extension/snowid--0.1.0.sql" "postgresql/$major/extension/$latest_upgrade" \
        "postgresql/$major/contrib/snowid/patroni/snowid-lease-table-on-the-nodes.yml" \
        "postgresql/$major/contrib/snowid/patroni/snowid-shared-registry.yml" \
        "postgresql/$major/contrib/snowid/patroni/snowid-etcd-registry.yml" \
        "postgresql/$major/contrib/snowid/prometheus/queries.yaml" \
        "postgresql/$major/contrib/snowid/prometheus/snowid-alerts.yml" \
        "doc/postgresql-$major-snowid/copyright"; do
        grep -q "$file\$" <<<"$contents" || { echo "$deb lacks $file" >&2; return 1; }
    done
    local maintainer copyright
    maintainer=$(dpkg-deb -f "$deb" Maintainer)
    [ "$maintainer" = "snowid maintainers <maintainers@snowid.dev>" ] ||
        { echo "$deb names the maintainer $maintainer" >&2; return 1; }
    dpkg-deb -I "$deb" | grep -qx "  License: PostgreSQL (see /usr/share/doc/postgresql-$major-snowid/copyright)." ||
        { echo "$deb's description names no licence" >&2; return 1; }
    copyright=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO --wildcards "*/doc/postgresql-$major-snowid/copyright")
    grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' <<<"$copyright" &&
        grep -qx 'Files: \*' <<<"$copyright" && grep -qx 'License: PostgreSQL' <<<"$copyright" ||
        { echo "$deb's copyright file does not name the PostgreSQL License for every file" >&2; return 1; }
    # The licence's text, its indentation and " ." lines taken out again, is LICENSE's below its
    # copyright line.
    [ "$(sed -n '/^License: PostgreSQL$/,$p' <<<"$copyright" | tail -n +2 | sed 's/^ //; s/^\.$//')" = \
        "$(sed -n '/^Permission/,$p' LICENSE)" ] ||
        { echo "$deb's copyright file does not hold LICENSE's terms" >&2; return 1; }
    local library dynamic
    library=$(mktemp)
    dpkg-deb --fsys-tarfile "$deb" | tar -xO --wildcards '*/snowid.so' >"$library"
    dynamic=$(readelf -d "$library")
    rm -f "$library"
    if grep -qE 'RUNPATH|RPATH' <<<"$dynamic"; then
        echo "$deb records a runpath" >&2
        return 1
    fi
    [ "$major" = 15 ] || return 0
    local apt=(as_root env DEBIAN_FRONTEND=noninteractive apt-get -y -qq)
    if dpkg -s postgresql-15-snowid >/dev/null 2>&1; then "${apt[@]}" remove postgresql-15-snowid >/dev/null; fi
    as_root rm -f "$("$PG_CONFIG" --pkglibdir)/snowid.so" "$("$PG_CONFIG" --sharedir)"/extension/snowid[.-]*
    "${apt[@]}" install "./$deb" >/dev/null
    local status=0
    (cd tests/cluster && PG_CONFIG="$PG_CONFIG" cargo nextest run --release -E 'binary(regress)') || status=$?
    # docs/install.md's uninstall steps, which end with apt-get remove: alone, since they take away
    # the files every other test uses.
    if [ "$status" = 0 ]; then
        (cd tests/cluster && PG_CONFIG="$PG_CONFIG" cargo nextest run --release --ignore-default-filter \
            -E 'binary(uninstall)') || status=$?
    fi
    if dpkg -s postgresql-15-snowid >/dev/null 2>&1; then "${apt[@]}" remove postgresql-15-snowid >/dev/null; fi
    [ "$status" = 0 ] || return "$status"
    local left
    left=$(ls -d "$("$PG_CONFIG" --pkglibdir)"/snowid* "$("$PG_CONFIG" --sharedir)"/extension/snowid* \
        /usr/share/doc/postgresql-15-snowid 2>/dev/null || true)
    [ -z "$left" ] || { echo "apt-get remove left files behind: $left" >&2; return 1; }
    echo "==> the package installed, passed the regression files and was uninstalled as docs/install.md says, without a trace"
    install_snowid
}

# The seed of the fault schedule that every run replays (its registry is PostgreSQL); a second
# schedule draws its seed afresh and runs with etcd.
FAULT_SCHEDULE_SEED=2026

# fault_schedules: two minutes of the fault schedule from FAULT_SCHEDULE_SEED, then two from a
# seed drawn at random; each prints the command that replays it. The schedules wait on timers
# mostly, and their checks time nothing closer than 20 s: beside them, at nice 19, what the cluster
# tests build (cluster_test_builds).
fault_schedules() {
    local status=0 builds_log=$times/cluster-test-builds.log
    build_nemesis
    (renice -n 19 "$BASHPID" >/dev/null && cluster_test_builds) >"$builds_log" 2>&1 &
    background_builds=$!
    scripts/nemesis.sh --no-install --built --seed "$FAULT_SCHEDULE_SEED" --minutes 2 || status=$?
    scripts/nemesis.sh --no-install --built --registry etcd --minutes 2 || status=$?
    wait "$background_builds" ||
        { cat "$builds_log" >&2; echo "the cluster tests' builds failed" >&2; status=1; }
    background_builds=
    return "$status"
}

# cluster_test_builds: the cluster tests; snowid 0.9.0 in a copy of PostgreSQL 15, for the tests
# that run its nodes beside this version's; what the client examples' test installs.
cluster_test_builds() {
    (cd tests/cluster && PG_CONFIG="$PG_CONFIG" cargo nextest run --release --no-run)
    build_release 0.9.0
    clients/run.sh --install
}

# test_major MAJOR PROFILE: every step on MAJOR, with the cluster tests of nextest's PROFILE; with
# the default profile, the fault schedules too.
test_major() {
    local major=$1 profile=$2
    timed "$major" "PostgreSQL $major ready" use_major "$major"
    if [ "$profile" = default ]; then
        timed "$major" "decisions and model checker" core_tests
    fi
    timed "$major" "unit, property and #[pg_test] tests" unit_and_pg_tests "$major"
    if ! speaks_tls "$major" && [ "$PG_MAJOR" != 15 ]; then
        # The test of a registry reached over TLS runs that registry on Debian's 15, where a run
        # that began with 15 has installed snowid already.
        timed "$major" "install into 15 (TLS registry)" install_snowid_into 15
    fi
    timed "$major" "build and install (release)" install_snowid
    if [ "$profile" = default ]; then
        timed "$major" "fault schedules" fault_schedules
    fi
    timed "$major" "cluster tests" cluster_tests "$major" "$profile"
    timed "$major" "Debian package" test_package "$major"
}

test_major "$PG_MAJOR" default
if $all_majors; then
    for major in "${MAJORS[@]}"; do
        [ "$major" = "$PG_MAJOR" ] || test_major "$major" per-major
    done
fi
