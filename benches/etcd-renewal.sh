#!/usr/bin/env bash
# benches/etcd-renewal.sh [BASE] [--seconds N]: what one renewal of an etcd lease costs with snowid
# as built from git revision BASE (default c588192, the last before the etcd gateway kept its
# connections) and as checked out now: etcd calls, TCP connections opened to etcd, bytes both ways
# and time per renewal, over plain HTTP and over TLS with client certificates. For each build and
# transport: one etcd member (Debian's etcd-server) on loopback, started here and stopped by its
# PID, and one fresh server with snowid.registry naming it and snowid.lease_ttl = 3 (a renewal a
# second), watched for --seconds (default 30) once its lease is held (see etcd_renewal.py for
# how); then, for each build, a first member whose host name never resolves. Writes
# benches/results/pgMAJOR/etcd-renewal.md and prints it; leaves the checkout's build
# installed. PG_CONFIG, when set, names the PostgreSQL to install into and run instead of PG_MAJOR's;
# SNOWID_RENEWAL_BASE_TARGET_DIR the base build's cargo target directory, which must not be the
# checkout's: cargo would take either build for the other's. Runs as root: it watches the loopback
# interface, and starts servers in mount namespaces of their own.
set -euo pipefail
usage="usage: benches/etcd-renewal.sh [BASE] [--seconds N]"
own_pg_config=${PG_CONFIG:-}
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
base_rev=c588192
if [ $# -ge 1 ] && [[ $1 != --* ]]; then
    base_rev=$1
    shift
fi
seconds=30
read_options "$usage" --seconds=seconds -- "$@"
is_root || usage_error "$usage" "run it as root"
[[ $seconds =~ ^[1-9][0-9]*$ ]] || usage_error "$usage" "--seconds $seconds is not a positive number"
if [ -n "$own_pg_config" ]; then
    install_packages build
    install_cargo_tools build
    PG_CONFIG=$own_pg_config
else
    prepare build
fi
install_debian_packages etcd-server openssl iproute2
cd "$REPO"
base_commit=$(git rev-parse --verify --quiet "$base_rev^{commit}") ||
    usage_error "$usage" "$base_rev is not a commit of this repository"

# package DIR OUT: the release build of the sources in DIR, laid out under OUT as it installs.
package() {
    echo "==> building $(basename "$2") (release)" >&2
    (cd "$1" && cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$2" >/dev/null)
}
work=$(mktemp -d)
chmod 755 "$work"
dir=${SNOWID_RENEWAL_DIR:-/tmp/snowid-etcd-renewal}
pg_port=${SNOWID_RENEWAL_PORT:-54380}
etcd_port=$((pg_port + 1)) peer_port=$((pg_port + 2)) metrics_port=$((pg_port + 3))
etcd_pid=
stop_etcd() {
    if [ -n "$etcd_pid" ]; then
        kill "$etcd_pid" 2>/dev/null || true
        wait "$etcd_pid" 2>/dev/null || true
        etcd_pid=
    fi
    rm -rf "$work/etcd"
}
cleanup() {
    stop_cluster "$dir"
    rm -rf "$dir"
    stop_etcd
    if [ -d "$work/head-build" ]; then as_root cp -a "$work/head-build/." /; fi
    rm -rf "$work"
}
trap cleanup EXIT
# The base's sources as committed, with no change to the repository's worktrees.
mkdir "$work/base"
git archive "$base_commit" | tar -x -m -C "$work/base"
CARGO_TARGET_DIR=${SNOWID_RENEWAL_BASE_TARGET_DIR:-$REPO/target/etcd-renewal-base} package "$work/base" "$work/base-build"
package "$REPO" "$work/head-build"

# A CA, etcd's certificate for 127.0.0.1 and the server's client certificate, readable by postgres.
tls=$work/tls
mkdir "$tls"
new_key() { openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "$@" 2>/dev/null; }
new_key -keyout "$tls/ca.key" -x509 -out "$tls/ca.crt" -days 2 -subj "/CN=snowid bench CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
for name in etcd node1; do
    new_key -keyout "$tls/$name.key" -out "$tls/$name.csr" -subj "/CN=$name"
    printf 'extendedKeyUsage = serverAuth, clientAuth\nsubjectAltName = IP:127.0.0.1\n' >"$tls/$name.ext"
    openssl x509 -req -in "$tls/$name.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
        -out "$tls/$name.crt" -days 2 -extfile "$tls/$name.ext" 2>/dev/null
done
is_root && chown -R postgres:postgres "$tls"
chmod 600 "$tls"/*.key
chmod 755 "$tls"

# start_etcd TRANSPORT: a one-member etcd on 127.0.0.1:$etcd_port, answering.
start_etcd() {
    local scheme=http tls_flags=()
    if [ "$1" = tls ]; then
        scheme=https
        tls_flags=(--cert-file "$tls/etcd.crt" --key-file "$tls/etcd.key" --trusted-ca-file "$tls/ca.crt"
            --client-cert-auth)
    fi
    local client="$scheme://127.0.0.1:$etcd_port" peer="http://127.0.0.1:$peer_port"
    etcd --name e1 --data-dir "$work/etcd" --listen-client-urls "$client" --advertise-client-urls "$client" \
        --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "e1=$peer" \
        --initial-cluster-state new --listen-metrics-urls "http://127.0.0.1:$metrics_port" \
        "${tls_flags[@]}" >"$work/etcd-$1.log" 2>&1 &
    etcd_pid=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$metrics_port/health" | grep -q '"health":"true"' && return 0
        sleep 0.1
    done
    echo "etcd did not start:" >&2
    tail -n 5 "$work/etcd-$1.log" >&2
    exit 1
}

psql_run() {
    as_cluster_owner "$("$PG_CONFIG" --bindir)/psql" -X -q -At -h "$dir" -p "$pg_port" -U postgres -d postgres -c "$1"
}

label_base="base $(git rev-parse --short "$base_commit")"
label_head="checkout $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' with changes')"
for side in base head; do
    label=label_$side
    as_root cp -a "$work/$side-build/." /
    for transport in http tls; do
        echo "==> ${!label}, $transport" >&2
        start_etcd "$transport"
        registry="etcd://127.0.0.1:$etcd_port/bench"
        [ "$transport" = tls ] && registry+="?cacert=$tls/ca.crt&cert=$tls/node1.crt&key=$tls/node1.key"
        start_cluster "$dir" "$pg_port" "shared_preload_libraries = 'snowid'" "snowid.worker_id = 5" \
            "snowid.registry = '$registry'" "snowid.lease_ttl = 3" ||
            { tail -n 3 "$dir/server.log" >&2; exit 1; }
        psql_run "CREATE EXTENSION snowid" >/dev/null
        for _ in $(seq 300); do
            [ "$(psql_run "SELECT lease_state FROM snowid_status()")" = held ] && break
            sleep 0.1
        done
        [ "$(psql_run "SELECT lease_state FROM snowid_status()")" = held ] ||
            { echo "the lease was not held: $(psql_run "SELECT last_error FROM snowid_status()")" >&2; exit 1; }
        sleep 2
        as_root python3 "$REPO/benches/etcd_renewal.py" measure --build "${!label}" --transport "$transport" \
            --port "$etcd_port" --metrics-port "$metrics_port" --etcd-pid "$etcd_pid" \
            --seconds "$seconds" >>"$work/samples.jsonl"
        stop_cluster "$dir"
        stop_etcd
    done
done
# A first member whose name never resolves (a DNS server that takes every query and answers none,
# on 127.0.0.2, which the server's processes alone see in their /etc/resolv.conf), the second
# named by address: how long the server takes to hold its lease, and how long a fast shutdown
# 0.5 s after the start takes.
printf 'nameserver 127.0.0.2\noptions timeout:8 attempts:1\n' >"$work/resolv.conf"
python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.2", 53))
while True:
    s.recvfrom(4096)
' &
dns_pid=$!
trap 'kill "$dns_pid"; wait "$dns_pid" 2>/dev/null || true; cleanup' EXIT
# start_resolving_nowhere SETTING...: as start_cluster, the server seeing $work/resolv.conf as
# /etc/resolv.conf; started_at is when pg_ctl was called.
start_resolving_nowhere() {
    local bindir
    bindir=$("$PG_CONFIG" --bindir)
    stop_cluster "$dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    chown postgres:postgres "$dir"
    runuser -u postgres -- "$bindir/initdb" -A trust -U postgres -D "$dir/data" >/dev/null
    printf '%s\n' "port = $pg_port" "listen_addresses = '127.0.0.1'" "unix_socket_directories = '$dir'" \
        "$@" >"$dir/data/postgresql.auto.conf"
    started_at=$(date +%s.%N)
    unshare -m sh -c 'mount --bind "$0" /etc/resolv.conf && exec runuser -u postgres -- "$@"' \
        "$work/resolv.conf" "$bindir/pg_ctl" -w -D "$dir/data" -l "$dir/server.log" start >/dev/null
}
since() { awk -v from="$1" -v now="$(date +%s.%N)" 'BEGIN { printf "%.3f", now - from }'; }
for side in base head; do
    label=label_$side
    echo "==> ${!label}, a member whose name never resolves" >&2
    as_root cp -a "$work/$side-build/." /
    start_etcd http
    settings=("shared_preload_libraries = 'snowid'" "snowid.worker_id = 5" "snowid.lease_ttl = 3"
        "snowid.registry = 'etcd://etcd-blackhole.test:$etcd_port,127.0.0.1:$etcd_port/lookup'")
    start_resolving_nowhere "${settings[@]}"
    psql_run "CREATE EXTENSION snowid" >/dev/null
    for _ in $(seq 600); do
        [ "$(psql_run "SELECT lease_state FROM snowid_status()")" = held ] && break
        sleep 0.05
    done
    held_s=$(since "$started_at")
    start_resolving_nowhere "${settings[@]}"
    sleep 0.5
    stopping_at=$(date +%s.%N)
    stop_cluster "$dir"
    stop_s=$(since "$stopping_at")
    printf '{"kind": "lookup", "build": "%s", "held_s": %s, "stop_s": %s}\n' "${!label}" "$held_s" "$stop_s" \
        >>"$work/samples.jsonl"
    stop_etcd
done
libcurl=$(curl -V | sed -n '1s/.*libcurl\/\([^ ]*\).*/\1/p')
grep -q AsynchDNS <(curl -V) && libcurl+=", resolving asynchronously (AsynchDNS)"
python3 "$REPO/benches/etcd_renewal.py" report --out "$REPO/benches/results/pg$PG_MAJOR/etcd-renewal.md" \
    --etcd-version "$(etcd --version | sed -n 's/^etcd Version: //p')" --libcurl "$libcurl" "$work/samples.jsonl"
