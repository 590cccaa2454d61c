# Sourced by the other scripts: the names and functions they share. Sourcing installs nothing: it
# checks PG_MAJOR, puts ~/.cargo/bin on PATH where cargo is not, and points PGRX_HOME at target/pgrx.
# `prepare PURPOSE` is the one step that installs: what building snowid needs (build), or also what
# testing it needs (test), then the PostgreSQL major PG_MAJOR picks: 15 (the default, Debian's), 16
# (unpacked once from PyPI's pgserver wheel, see postgresql-wheel.sh), 17 or 18 (built once from
# Debian's source packages, see postgresql-source.sh); PG_CONFIG names it. scripts/setup.sh runs it
# alone. Idempotent and quick on re-run; runs as root, or as a user who may sudo.
set -euo pipefail

PGRX_VERSION=0.18.0
NEXTEST_MINIMUM=0.9.91
NEXTEST_VERSION=0.9.143
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MAJORS=(15 16 17 18)

# usage_error USAGE MESSAGE: ends the script that sourced this file, saying what was wrong and how
# to call it.
usage_error() {
    echo "$(basename "$0"): $2" >&2
    echo "$1" >&2
    exit 2
}

# read_options USAGE --FLAG=VARIABLE... -- ARG...: sets each VARIABLE to the value that follows its
# --FLAG among the ARGs; a flag without a value, or one not named, is a usage error.
read_options() {
    local usage=$1 names=() name variable
    shift
    while [ "$1" != -- ]; do names+=("$1"); shift; done
    shift
    while [ $# -gt 0 ]; do
        [ $# -ge 2 ] || usage_error "$usage" "$1 needs a value"
        variable=
        for name in "${names[@]}"; do
            if [ "${name%%=*}" = "$1" ]; then variable=${name#*=}; fi
        done
        [ -n "$variable" ] || usage_error "$usage" "unknown argument $1"
        printf -v "$variable" '%s' "$2"
        shift 2
    done
}

is_root() { [ "$(id -u)" = 0 ]; }
as_root() { if is_root; then "$@"; else sudo "$@"; fi; }

source "$REPO/scripts/postgresql-source.sh"
source "$REPO/scripts/postgresql-wheel.sh"

PG_MAJOR=${PG_MAJOR:-15}
if [[ ! $PG_MAJOR =~ ^[0-9]+$ || " ${MAJORS[*]} " != *" $PG_MAJOR "* ]]; then
    echo "PG_MAJOR must be one of: ${MAJORS[*]}" >&2
    exit 1
fi

pg_config_of() {
    case $1 in
    15) echo "/usr/lib/postgresql/15/bin/pg_config" ;;
    16) wheel_pg_config "$1" ;;
    *) echo "$(source_prefix_of "$1")/bin/pg_config" ;;
    esac
}

# Debian packages, by purpose. Building: PostgreSQL 15's server and headers, clang for pgrx's
# bindings, libcurl4-openssl-dev (snowid links libcurl for the etcd registry), curl, make, bzip2,
# bison, flex, libicu-dev and zlib1g-dev to build PostgreSQL 17 and 18, and patchelf to take the
# runpath out of the Debian package's library. Testing, also: postgresql-15-partman for the
# partitioning tests; Patroni and etcd for the failover and etcd registry tests; postgres_exporter
# and Prometheus (for promtool) for the monitoring tests; nftables and iproute2 for the fault
# schedule's network; procps (pgrep) for scripts/leftovers.sh.
BUILD_PACKAGES=(postgresql-15 postgresql-server-dev-15 libpq-dev libcurl4-openssl-dev curl openssl clang
    libclang-dev pkg-config libssl-dev sudo make bzip2 bison flex libicu-dev zlib1g-dev patchelf)
TEST_PACKAGES=(postgresql-15-partman patroni etcd-server etcd-client prometheus-postgres-exporter prometheus
    nftables iproute2 procps)

# install_packages PURPOSE: the Debian packages that PURPOSE (build or test) needs, when missing.
install_packages() {
    local packages=("${BUILD_PACKAGES[@]}")
    # pip fetches PostgreSQL 16 (postgresql-wheel.sh).
    python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
    if [ "$1" = test ]; then
        packages+=("${TEST_PACKAGES[@]}")
        # The client examples (clients/) run under Node.js with npm and Python with venv; Debian's
        # serve where the machine has neither.
        command -v npm >/dev/null || packages+=(nodejs npm)
        python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
    fi
    install_debian_packages "${packages[@]}"
}

# install_debian_packages PACKAGE...: those of the Debian packages that are missing.
install_debian_packages() {
    local package missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

if ! command -v cargo >/dev/null; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi

# install_cargo_tools PURPOSE: cargo-pgrx, and for testing cargo-nextest, which runs the cluster
# tests side by side (tests/cluster/.config/nextest.toml says how), from the version that brought
# test priorities on.
install_cargo_tools() {
    command -v cargo >/dev/null || { echo "snowid needs a Rust toolchain (cargo): install it with rustup" >&2; exit 1; }
    if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
        echo "==> installing cargo-pgrx $PGRX_VERSION (a few minutes, once)"
        cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
    fi
    [ "$1" = test ] || return 0
    if ! printf '%s\n%s\n' "$NEXTEST_MINIMUM" "$(cargo nextest --version 2>/dev/null | sed -n 's/^cargo-nextest \([0-9.]*\).*/\1/p')" |
        sort -V -C; then
        echo "==> installing cargo-nextest $NEXTEST_VERSION (a few minutes, once)"
        cargo install cargo-nextest --version "$NEXTEST_VERSION" --locked
    fi
}

# The scripts keep a pgrx configuration of their own, naming exactly the majors present here.
export PGRX_HOME=${SNOWID_PGRX_HOME:-$REPO/target/pgrx}

# major_ready MAJOR: Debian's PostgreSQL 15 is installed, or the pinned wheel or build of MAJOR is.
major_ready() {
    case $1 in
    15) [ -x "$(pg_config_of 15)" ] ;;
    16) wheel_ready "$1" ;;
    *) [ "$(cat "$(source_marker "$1")" 2>/dev/null)" = "$(source_of "$1")" ] ;;
    esac
}

# use_major MAJOR: PostgreSQL MAJOR ready (unpacked for 16, built for 17 and 18) and known to pgrx;
# PG_CONFIG names it.
use_major() {
    case $1 in
    15) ;;
    16) install_wheel_postgresql "$1" ;;
    *) build_postgresql "$1" ;;
    esac
    PG_CONFIG=$(pg_config_of "$1")
    local major path args=() wanted=()
    for major in "${MAJORS[@]}"; do
        major_ready "$major" || continue
        path=$(pg_config_of "$major")
        args+=("--pg$major" "$path")
        wanted+=("pg$major = \"$path\"")
    done
    local config="$PGRX_HOME/config.toml"
    if [ "$(grep -s '^pg[0-9]* = ' "$config" | sort)" != "$(printf '%s\n' "${wanted[@]}" | sort)" ]; then
        rm -f "$config"
        cargo pgrx init "${args[@]}"
    fi
}

# prepare PURPOSE: everything PURPOSE (build or test) needs installed, and PG_MAJOR ready.
prepare() {
    case $1 in
    build | test) ;;
    *) echo "prepare: build or test, not $1" >&2; exit 2 ;;
    esac
    install_packages "$1"
    install_cargo_tools "$1"
    use_major "$PG_MAJOR"
}

# speaks_tls MAJOR: whether PostgreSQL MAJOR's server was built with OpenSSL (16's from the wheel
# was not).
speaks_tls() {
    [[ $("$(pg_config_of "$1")" --configure) =~ --with-(openssl|ssl=openssl) ]]
}

# matplotlib, for the benchmarks' charts, when missing.
install_matplotlib() {
    python3 -c 'import matplotlib' 2>/dev/null && return 0
    echo "==> installing matplotlib for the chart" >&2
    python3 -m pip install --quiet matplotlib 2>/dev/null || as_root apt-get install -y -qq python3-matplotlib >&2
}

# install_snowid_into MAJOR: install_snowid into PostgreSQL MAJOR, which must be ready.
install_snowid_into() {
    (PG_CONFIG=$(pg_config_of "$1") && install_snowid)
}

# Builds snowid in release mode and installs it into the PostgreSQL that PG_CONFIG names.
install_snowid() {
    echo "==> building and installing snowid (release)"
    local sudo_flag=()
    is_root || sudo_flag=(--sudo)
    (cd "$REPO" && cargo pgrx install --release --pg-config "$PG_CONFIG" "${sudo_flag[@]}") || return
    # The install scripts of released versions, so that ALTER EXTENSION snowid UPDATE can be tested.
    as_root install -m 644 "$REPO"/sql/snowid--*.sql "$("$PG_CONFIG" --sharedir)/extension/"
}

# The commit each earlier release was built from, for the cluster tests that run its nodes beside
# this version's (fleet.rs, etcd.rs): 0.9.0's is the last before its changelog opened the next
# release.
declare -A RELEASE_COMMITS=([0.9.0]=38f53a1e776759dbb2ac9a6399b2d967ee612a3f)

# build_release VERSION: snowid VERSION built from its commit into a copy of Debian's PostgreSQL 15
# under target/snowid-VERSION, once. PostgreSQL finds its library and share directories relative
# to its programs, so that copy's servers load VERSION's library and scripts and nothing of this
# checkout's. It builds in target/releases: in this checkout's target directory, its library would
# overwrite this version's, which cargo would then take for fresh. It builds without optimisation:
# the tests need that version's code, not its speed, and the build runs beside the fault schedules.
build_release() {
    local version=$1 commit=${RELEASE_COMMITS[$1]} root=$REPO/target/snowid-$1
    local lib=usr/lib/postgresql/15 share=usr/share/postgresql/15
    # Outside this checkout, whose workspace would claim it.
    local src=${TMPDIR:-/tmp}/snowid-$version-source
    local git=(git -c safe.directory="$REPO" -C "$REPO")
    [ "$(cat "$root/built-from" 2>/dev/null)" = "$commit" ] && return 0
    echo "==> building snowid $version from $commit into a copy of PostgreSQL 15"
    "${git[@]}" cat-file -e "$commit^{commit}" || {
        echo "build_release: this clone lacks $commit, snowid $version's commit: clone with its history" >&2
        return 1
    }
    rm -rf "$root" "$src"
    mkdir -p "$(dirname "$root/$lib")" "$(dirname "$root/$share")" "$src"
    cp -a "/$lib" "$root/$lib"
    cp -a "/$share" "$root/$share"
    rm -f "$root/$lib/lib/snowid.so" "$root/$share/extension"/snowid[.-]*
    "${git[@]}" archive "$commit" | tar -x -C "$src"
    (cd "$src" && CARGO_TARGET_DIR=$REPO/target/releases cargo pgrx package --debug \
        --pg-config "$(pg_config_of 15)" --out-dir "$root" >"$root/build.log" 2>&1) || { tail -n 20 "$root/build.log" >&2; return 1; }
    rm -rf "$src"
    as_cluster_owner test -x "$root/$lib/bin/postgres" || {
        echo "build_release: the postgres user cannot run $root/$lib/bin/postgres: let it reach $REPO" >&2
        return 1
    }
    echo "$commit" >"$root/built-from"
}

# build_nemesis: the fault schedule's harness, tests/cluster/target/release/nemesis.
build_nemesis() {
    (cd "$REPO/tests/cluster" && cargo build --release --quiet --bin nemesis)
}

# Runs a PostgreSQL program as the user that owns the throwaway clusters (postgres, when we are root).
as_cluster_owner() {
    if is_root; then runuser -u postgres -- "$@"; else "$@"; fi
}

# start_cluster DIR PORT SETTING...: a fresh cluster in DIR on 127.0.0.1:PORT with the settings added.
start_cluster() {
    local dir=$1 port=$2
    shift 2
    local bindir
    bindir=$("$PG_CONFIG" --bindir)
    stop_cluster "$dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    is_root && chown postgres:postgres "$dir"
    as_cluster_owner "$bindir/initdb" -A trust -U postgres -D "$dir/data" >/dev/null
    {
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$dir'"
        printf '%s\n' "$@"
    } >"$dir/data/postgresql.auto.conf"
    as_cluster_owner "$bindir/pg_ctl" -w -D "$dir/data" -l "$dir/server.log" start >/dev/null
}

stop_cluster() {
    local dir=$1
    [ -f "$dir/data/postmaster.pid" ] || return 0
    as_cluster_owner "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$dir/data" -m fast stop >/dev/null || true
}

# start_etcd DIR CLIENT_PORT PEER_PORT: a one-member etcd in the background on loopback over plain
# http, its data in DIR/etcd, its log DIR/etcd.log and its PID in DIR/etcd.pid; answering once this
# returns.
start_etcd() {
    local dir=$1 client="http://127.0.0.1:$2" peer="http://127.0.0.1:$3"
    etcd --name snowid --data-dir "$dir/etcd" \
        --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
        --initial-cluster "snowid=$peer" >"$dir/etcd.log" 2>&1 &
    echo $! >"$dir/etcd.pid"
    local tries
    for tries in $(seq 100); do
        curl -sf "$client/health" >/dev/null && return 0
        sleep 0.1
    done
    tail -n 5 "$dir/etcd.log" >&2
    return 1
}
