#!/usr/bin/env bash
# scripts/demo.sh [--no-install] [patroni | stop]
#
# Without an argument: installs snowid, starts a throwaway cluster configured for it, and shows ids
# being made and decoded.
#
# patroni (as root): a two-node Patroni cluster on this machine, with one etcd member, each node
# with a worker id of its own (1 and 2) set by contrib/patroni/snowid-lease-table-on-the-nodes.yml
# in its own patroni.yml; shows ids made on the first primary, a switchover, and ids made on the new
# one. Installs Patroni and etcd from Debian's packages when missing.
#
# stop: stops what either left running. --no-install installs nothing: snowid, and for patroni
# Patroni and etcd, are installed already.
# SNOWID_DEMO_DIR (default /tmp/snowid-demo) and SNOWID_DEMO_PORT (54329) place the cluster;
# SNOWID_DEMO_PATRONI_PORTS the Patroni demo's six: etcd's client and peer ports, then each node's
# PostgreSQL and REST API ports (default "54379 54380 54331 54381 54332 54382").
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
usage="usage: scripts/demo.sh [--no-install] [patroni | stop]"
install=true
mode=
for arg in "$@"; do
    case $arg in
    --no-install) install=false ;;
    patroni | stop) [ -z "$mode" ] || usage_error "$usage" "one of patroni and stop at most"; mode=$arg ;;
    *) usage_error "$usage" "unknown argument $arg" ;;
    esac
done
dir=${SNOWID_DEMO_DIR:-/tmp/snowid-demo}
port=${SNOWID_DEMO_PORT:-54329}
patroni_dir=$dir-patroni
read -r -a patroni_ports <<<"${SNOWID_DEMO_PATRONI_PORTS:-54379 54380 54331 54381 54332 54382}"
[ ${#patroni_ports[@]} = 6 ] || usage_error "$usage" "SNOWID_DEMO_PATRONI_PORTS names six ports, not ${#patroni_ports[@]}"
read -r etcd_port etcd_peer_port pg_port1 rest_port1 pg_port2 rest_port2 <<<"${patroni_ports[*]}"
if [ "$mode" = patroni ] && ! is_root; then
    echo "demo.sh patroni: run it as root, which starts Patroni and PostgreSQL as postgres" >&2
    exit 1
fi

if $install; then
    prepare build
else
    PG_CONFIG=$(pg_config_of "$PG_MAJOR")
fi
bindir=$("$PG_CONFIG" --bindir)

# psql_at PORT: psql as postgres on 127.0.0.1:PORT, echoing each statement.
psql_at() {
    "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d postgres -e
}

# wait_for WHAT COMMAND...: runs COMMAND every half second until it succeeds, for a minute at most.
wait_for() {
    local what=$1 tries=120
    shift
    until "$@" >/dev/null 2>&1; do
        tries=$((tries - 1))
        [ $tries -gt 0 ] || { echo "demo.sh: $what took longer than a minute" >&2; return 1; }
        sleep 0.5
    done
}

# recovery_is PORT t|f: the server on PORT accepts connections, and is in recovery (t) or not (f).
recovery_is() {
    [ "$("$bindir/psql" -X -At -h 127.0.0.1 -p "$1" -U postgres -d postgres -c 'SELECT pg_is_in_recovery()')" = "$2" ]
}

# stop_by_pid_file FILE: ends the process FILE names, and waits for it to be gone.
stop_by_pid_file() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null || true
    wait_for "process $pid ($1) ending" bash -c "! kill -0 $pid"
    rm -f "$1"
}

stop_patroni_demo() {
    local number
    for number in 2 1; do
        # Patroni stops its PostgreSQL when it stops; a postmaster left behind all the same is
        # stopped here.
        stop_by_pid_file "$patroni_dir/node$number/patroni.pid"
        stop_cluster "$patroni_dir/node$number"
    done
    stop_by_pid_file "$patroni_dir/etcd.pid"
}

# node_config NUMBER PG_PORT REST_PORT: node NUMBER's patroni.yml (scripts/patroni-node.yml), with
# snowid's fragment among the parameters of the node's own postgresql section, its worker id made
# NUMBER.
node_config() {
    local config parameters
    config=$(<"$REPO/scripts/patroni-node.yml")
    parameters=$(grep -v '^#' "$REPO/contrib/patroni/snowid-lease-table-on-the-nodes.yml" |
        sed -e '1,2d' -e "s/snowid.worker_id: 1\$/snowid.worker_id: $1/")
    if [[ $parameters != *"snowid.worker_id: $1"* ]]; then
        echo "demo.sh: contrib/patroni/snowid-lease-table-on-the-nodes.yml sets no snowid.worker_id: 1" >&2
        return 1
    fi
    # Quoted, a replacement is taken as it is (bash 5.2 reads an unquoted & as the match).
    config=${config//@SCOPE@/"snowid-demo"}
    config=${config//@NAME@/"node$1"}
    config=${config//@PORT@/"$2"}
    config=${config//@REST_PORT@/"$3"}
    config=${config//@ETCD_PORT@/"$etcd_port"}
    config=${config//@DIR@/"$patroni_dir/node$1"}
    config=${config//@BIN_DIR@/"$bindir"}
    config=${config//@DCS@/}
    config=${config//@DCS_PARAMETERS@/}
    config=${config//@PARAMETERS@/"$parameters"}
    printf '%s\n' "$config"
}

# start_node NUMBER PG_PORT REST_PORT: writes node NUMBER's patroni.yml and starts its Patroni as
# postgres; the pid file holds Patroni's own process id.
start_node() {
    local node_dir=$patroni_dir/node$1
    mkdir -p "$node_dir"
    node_config "$@" >"$node_dir/patroni.yml"
    chown -R postgres:postgres "$node_dir"
    setpriv --reuid=postgres --regid=postgres --init-groups -- \
        env PATH="$bindir:$PATH" HOME=/var/lib/postgresql \
        patroni "$node_dir/patroni.yml" >"$node_dir/patroni.log" 2>&1 &
    echo $! >"$node_dir/patroni.pid"
}

# port_is_free PORT: nothing listens on 127.0.0.1:PORT.
port_is_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

patroni_demo() {
    if $install; then install_debian_packages patroni etcd-server etcd-client; fi
    stop_patroni_demo
    local free
    for free in "${patroni_ports[@]}"; do
        port_is_free "$free" || { echo "demo.sh patroni: port $free is in use" >&2; exit 1; }
    done
    rm -rf "$patroni_dir"
    mkdir -p "$patroni_dir"
    trap 'echo "demo.sh patroni failed: see $patroni_dir/etcd.log and $patroni_dir/node*/patroni.log; scripts/demo.sh stop stops what it started" >&2' ERR
    echo "==> etcd on 127.0.0.1:$etcd_port, then two Patroni nodes in $patroni_dir"
    start_etcd "$patroni_dir" "$etcd_port" "$etcd_peer_port"
    start_node 1 "$pg_port1" "$rest_port1"
    wait_for "node1 becoming the primary" recovery_is "$pg_port1" f
    psql_at "$pg_port1" <<'SQL'
CREATE EXTENSION snowid;
SELECT snowid_wait_ready();
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text, made_on text DEFAULT current_setting('port'));
INSERT INTO orders (item) VALUES ('book'), ('pen');
SQL
    start_node 2 "$pg_port2" "$rest_port2"
    wait_for "node2 streaming from node1" \
        "$bindir/psql" -X -At -h 127.0.0.1 -p "$pg_port2" -U postgres -d postgres -c "SELECT 1 FROM orders HAVING count(*) = 2"
    echo "==> each node has its own worker id; the standby refuses to issue until it is promoted"
    psql_at "$pg_port1" <<<"SELECT worker_id, lease_state, in_recovery FROM snowid_status();"
    psql_at "$pg_port2" <<<"SELECT worker_id, lease_state, in_recovery FROM snowid_status();"
    echo "==> a switchover to node2, which issues under its own worker id at once"
    as_cluster_owner patronictl -c "$patroni_dir/node1/patroni.yml" switchover \
        --leader node1 --candidate node2 --force >"$patroni_dir/switchover.log" 2>&1 ||
        { cat "$patroni_dir/switchover.log" >&2; false; }
    wait_for "node2 becoming the primary" recovery_is "$pg_port2" f
    psql_at "$pg_port2" <<'SQL'
SELECT snowid_wait_ready();
INSERT INTO orders (item) VALUES ('lamp');
SELECT o.item, o.made_on, d.worker_id, o.id FROM orders o, snowid_decode(o.id) d ORDER BY o.id;
SQL
    wait_for "node1 rejoining as a standby" recovery_is "$pg_port1" t
    trap - ERR
    echo "==> the cluster keeps running: patronictl -c $patroni_dir/node1/patroni.yml list"
    echo "    stop it with: PG_MAJOR=$PG_MAJOR $0 stop"
}

case "$mode" in
stop)
    stop_cluster "$dir"
    if is_root; then
        stop_patroni_demo
    elif ls "$patroni_dir"/node*/patroni.pid >/dev/null 2>&1; then
        echo "demo.sh stop: the Patroni demo runs as postgres; stop it as root" >&2
        exit 1
    fi
    exit
    ;;
patroni)
    if $install; then install_snowid; fi
    patroni_demo
    exit
    ;;
esac

if $install; then install_snowid; fi
echo "==> starting a throwaway cluster in $dir on port $port"
start_cluster "$dir" "$port" "shared_preload_libraries = 'snowid'" "snowid.worker_id = 17" "timezone = 'UTC'"

psql_at "$port" <<'SQL'
CREATE EXTENSION snowid;
-- True once the lease worker holds worker id 17, within a second or so; ids are issued from then on.
SELECT snowid_wait_ready();
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT snowid_next(), item text);
INSERT INTO orders (item) VALUES ('book'), ('pen'), ('lamp');
SELECT o.id, o.item, d.* FROM orders o, snowid_decode(o.id) d ORDER BY o.id;
SELECT worker_id, last_id, ids_issued, lease_state, lease_holder, registry FROM snowid_status();
SQL
echo "==> the cluster keeps running: psql -h 127.0.0.1 -p $port -U postgres"
echo "    stop it with: PG_MAJOR=$PG_MAJOR $0 stop"
