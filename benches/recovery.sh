#!/usr/bin/env bash
# benches/recovery.sh --registry postgres|etcd|server [--lease-ttl S] [--kinds K,...] [--ratios R,...]
#                     [--positions after,before] [--trials N] [--report DIR] [--no-install]
#
# What one fault costs: the fault schedule's fleet (four nodes and their registry, each on a test
# host of its own) struck by one fault at a time, each after the fleet has issued undisturbed for a
# lease and 5 s, for D = ratio × the struck node's lease margin, begun right after or right before
# a renewal (see tests/cluster/src/recovery.rs for what is measured and what the minimum is).
# Kinds: worker-stall node-crash node-pause partition clock-back-little clock-back-lot, and
# registry-crash registry-pause registry-failover row-deleted (postgres) or etcd-leader-kill
# etcd-leader-pause etcd-member-cut (etcd); with server, each node's lease table on its own server,
# the node's kinds but partition, and row-deleted from that table. Every kind the mode has by
# default. Ratios 0.5,0.9,1.1,2,4, both positions and 10 trials each by default, at
# snowid.lease_ttl 6. Writes recovery.md, trials.tsv, availability.tsv and availability.png into
# DIR (by default benches/results/recovery/REGISTRY-ttlS). Runs against PostgreSQL PG_MAJOR (15 by
# default), into which it installs snowid unless --no-install says that is done. Needs root, for
# the namespaces.
set -euo pipefail
usage="usage: benches/recovery.sh --registry postgres|etcd|server [--lease-ttl S] [--kinds K,...] [--ratios R,...] [--positions after,before] [--trials N] [--report DIR] [--no-install]"
install=true
args=()
report=
registry=
ttl=6
while [ $# -gt 0 ]; do
    case $1 in
    --no-install) install=false; shift ;;
    --report) report=$(realpath -m "${2:?$usage}"); shift 2 ;;
    --registry) registry=${2:?$usage}; args+=("$1" "$2"); shift 2 ;;
    --lease-ttl) ttl=${2:?$usage}; args+=("$1" "$2"); shift 2 ;;
    --kinds | --ratios | --positions | --trials) args+=("$1" "${2:?$usage}"); shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
[ -n "$registry" ] || { echo "$usage" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "benches/recovery.sh makes network namespaces: run it as root" >&2; exit 2; }

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
prepare test
cd "$REPO"
$install && install_snowid
report=${report:-$REPO/benches/results/recovery/$registry-ttl$ttl}
(cd tests/cluster && cargo build --release --quiet --bin recovery)
PG_CONFIG="$PG_CONFIG" tests/cluster/target/release/recovery "${args[@]}" --report "$report"
install_matplotlib
python3 "$REPO/benches/recovery_chart.py" "$report"
