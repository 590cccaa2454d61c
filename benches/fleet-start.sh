#!/usr/bin/env bash
# A fleet that starts at once, measured: --servers PostgreSQL servers (default 64) on this machine,
# each with snowid.any_worker_id on and a small shared_buffers, all leasing from one shared registry
# (a PostgreSQL server, then a one-member etcd on loopback), started together: each server's time
# until it issues, and the registry's CPU and statements per second meanwhile; then claimants
# playing the other servers, each making the lease worker's calls, until the registry holds each
# size of --leases leases (default 64, 256 and 1,024): its CPU per renewal at each size. Checks that
# every server issues under a worker id of its own and that no id comes twice. Writes
# benches/results/pgMAJOR/fleet-start.md (or --out) and prints it; benches/fleet_start.py says how
# each figure is counted.
#
# The servers are copies of one data directory made by initdb, with the extension created in its
# database postgres: snowid tells copies apart by their data directory (its device, inode number
# and birth time, beside the system identifier), and a shared registry takes a copy for a server of
# its own (docs/registries.md), so one initdb serves them all. PostgreSQL comes from the major that
# PG_MAJOR picks, snowid built and installed into it; or, when PG_CONFIG is set, from that
# installation, into which snowid must already be installed. The PostgreSQL registry preloads
# pg_stat_statements, which counts its statements; etcd serves its counters at /metrics.
set -euo pipefail
registry=both servers=64 leases=64,256,1024 window=60 lease_ttl=30 shared_buffers=2MB out=
usage="usage: benches/fleet-start.sh [--registry postgres|etcd|both] [--servers N] [--leases N,N,...]
                              [--window SECONDS] [--lease-ttl SECONDS] [--shared-buffers SIZE] [--out FILE]
  --registry: which registry to measure (default both, PostgreSQL first)
  --servers: how many servers start at once (default 64)
  --leases: the sizes the registry's renewals are measured at, each at least --servers and at
            most 1024 (default 64,256,1024)
  --window: seconds each size is measured for (default 60)
  --lease-ttl: every server's snowid.lease_ttl, also the claimants' (default 30, the default)
  --shared-buffers: every server's (default 2MB)"
user_pg_config=${PG_CONFIG:-}
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
read_options "$usage" --registry=registry --servers=servers --leases=leases --window=window \
    --lease-ttl=lease_ttl --shared-buffers=shared_buffers --out=out -- "$@"
case $registry in
postgres) registries=(postgres) ;;
etcd) registries=(etcd) ;;
both) registries=(postgres etcd) ;;
*) usage_error "$usage" "--registry $registry is not postgres, etcd or both" ;;
esac
[[ $servers =~ ^[1-9][0-9]*$ && $servers -le 600 ]] || usage_error "$usage" "--servers $servers is not a number from 1 to 600"
[[ $window =~ ^[1-9][0-9]*$ ]] || usage_error "$usage" "--window $window is not a positive number"
[[ $lease_ttl =~ ^[1-9][0-9]*$ && $lease_ttl -ge 3 && $lease_ttl -le 3600 ]] ||
    usage_error "$usage" "--lease-ttl $lease_ttl is not a number of seconds from 3 to 3600"
[[ $shared_buffers =~ ^[1-9][0-9]*(kB|MB|GB)$ ]] || usage_error "$usage" "$shared_buffers is not a size such as 2MB"
IFS=, read -ra sizes <<<"$leases"
previous=$servers
for size in "${sizes[@]}"; do
    [[ $size =~ ^[1-9][0-9]*$ && $size -ge $previous && $size -le 1024 ]] ||
        usage_error "$usage" "--leases $leases: each size must be at least --servers and the one before, at most 1024"
    previous=$size
done

checkout="$(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet HEAD -- src sql Cargo.toml build.rs || echo ' with changes')"
if [ -n "$user_pg_config" ]; then
    PG_CONFIG=$user_pg_config
    echo "==> PostgreSQL of $PG_CONFIG, with the snowid installed there"
    install_debian_packages etcd-server curl
    snowid="the build installed with PG_CONFIG, the checkout at $checkout"
else
    prepare build
    install_debian_packages etcd-server
    install_snowid >&2
    snowid="release build of the checkout at $checkout"
fi
bindir=$("$PG_CONFIG" --bindir)
major=$("$PG_CONFIG" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
version=$("$PG_CONFIG" --version | sed 's/^PostgreSQL //')
out=${out:-$REPO/benches/results/pg$major/fleet-start.md}
fleet=(python3 "$REPO/benches/fleet_start.py")

# Ports above the cluster tests' (20000 to 31999) and below the kernel's ephemeral ones.
base=${SNOWID_FLEET_START_PORT:-32100}
registry_port=$base etcd_port=$((base + 1)) etcd_peer_port=$((base + 2)) first_server_port=$((base + 10))
for port in $(seq "$base" $((first_server_port + servers - 1))); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port is in use; set SNOWID_FLEET_START_PORT to a base with $((servers + 10)) free ports" >&2
        exit 1
    fi
done

work=$(mktemp -d /tmp/snowid-fleet-start-XXXXXX)
chmod 755 "$work"
etcd_pid=
# Every server and etcd this script started is stopped, whatever happened.
cleanup() {
    local data pids=()
    for data in "$work"/*/data; do
        [ -f "$data/postmaster.pid" ] || continue
        as_cluster_owner "$bindir/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 &
        pids+=($!)
    done
    [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}" || true
    if [ -n "$etcd_pid" ]; then kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"

# A file that the cluster owner writes.
owned_dir() {
    mkdir -p "$1"
    is_root && chown postgres:postgres "$1"
    return 0
}

echo "==> one data directory for every server (initdb, then CREATE EXTENSION snowid)"
owned_dir "$work/template"
as_cluster_owner "$bindir/initdb" -A trust -U postgres -D "$work/template/data" >/dev/null
settings="shared_buffers = $shared_buffers, max_connections = 10"
{
    echo "listen_addresses = '127.0.0.1'"
    echo "unix_socket_directories = '$work/template'"
    echo "port = $first_server_port"
} >"$work/template/data/postgresql.auto.conf"
as_cluster_owner "$bindir/pg_ctl" -w -D "$work/template/data" -l "$work/template/server.log" start >/dev/null
as_cluster_owner "$bindir/psql" -X -q -h 127.0.0.1 -p "$first_server_port" -U postgres -d postgres \
    -c "CREATE EXTENSION snowid" >/dev/null
as_cluster_owner "$bindir/pg_ctl" -w -D "$work/template/data" -m fast stop >/dev/null

# make_servers REGISTRY_SETTING: the servers' data directories, copies of the template, each with
# its port and the snowid settings; lists them in $work/servers.
make_servers() {
    local number dir port
    : >"$work/servers"
    for number in $(seq "$servers"); do
        dir="$work/server$number"
        port=$((first_server_port + number - 1))
        rm -rf "$dir"
        owned_dir "$dir"
        cp -a "$work/template/data" "$dir/data"
        cat >"$dir/data/postgresql.auto.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
port = $port
cluster_name = 'fleet$number'
shared_buffers = '$shared_buffers'
max_connections = 10
shared_preload_libraries = 'snowid'
snowid.any_worker_id = on
snowid.lease_ttl = $lease_ttl
snowid.registry = '$1'
EOF
        echo "$dir/data $port" >>"$work/servers"
    done
}

stop_servers() {
    local data pids=()
    for data in "$work"/server*/data; do
        [ -f "$data/postmaster.pid" ] || continue
        as_cluster_owner "$bindir/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 &
        pids+=($!)
    done
    [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}" || true
    rm -rf "$work"/server*
}

measure() {
    "${fleet[@]}" measure --servers "$work/servers" --pg-ctl "$bindir/pg_ctl" --lease-ttl "$lease_ttl" \
        --leases "$leases" --window "$window" --settings "$settings" --snowid "$snowid" "$@"
}

files=()
for kind in "${registries[@]}"; do
    # The data directories are written before the measurement, not during it.
    sync
    case $kind in
    postgres)
        echo "==> the registry: PostgreSQL $version on port $registry_port, CREATE EXTENSION snowid"
        owned_dir "$work/registry"
        as_cluster_owner "$bindir/initdb" -A trust -U postgres -D "$work/registry/data" >/dev/null
        cat >"$work/registry/data/postgresql.auto.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$work/registry'
port = $registry_port
max_connections = $((${sizes[-1]} + 50))
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = top
EOF
        as_cluster_owner "$bindir/pg_ctl" -w -D "$work/registry/data" -l "$work/registry/server.log" start >/dev/null
        # A registry made for servers that never held a lease from it grants at once.
        as_cluster_owner "$bindir/psql" -X -q -h 127.0.0.1 -p "$registry_port" -U postgres -d postgres \
            -c "CREATE EXTENSION snowid" -c "SELECT snowid_registry_is_new()" \
            -c "CREATE EXTENSION pg_stat_statements" >/dev/null
        make_servers "host=127.0.0.1 port=$registry_port dbname=postgres user=postgres"
        sync
        measure --registry postgres --registry-port "$registry_port" --registry-version "$version" \
            --registry-pid "$(head -1 "$work/registry/data/postmaster.pid")" --out "$work/postgres.json"
        stop_servers
        as_cluster_owner "$bindir/pg_ctl" -D "$work/registry/data" -m immediate stop >/dev/null
        ;;
    etcd)
        etcd_version=$(etcd --version | sed -n 's/^etcd Version: //p')
        echo "==> the registry: etcd $etcd_version, one member on port $etcd_port"
        start_etcd "$work" "$etcd_port" "$etcd_peer_port"
        etcd_pid=$(cat "$work/etcd.pid")
        make_servers "etcd://127.0.0.1:$etcd_port/snowid"
        sync
        measure --registry etcd --etcd "127.0.0.1:$etcd_port" --registry-version "$etcd_version" \
            --registry-pid "$etcd_pid" --out "$work/etcd.json"
        stop_servers
        kill "$etcd_pid"
        wait "$etcd_pid" 2>/dev/null || true
        etcd_pid=
        ;;
    esac
    files+=("$work/$kind.json")
done
"${fleet[@]}" report --out "$out" "${files[@]}"
