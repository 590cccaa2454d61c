#!/usr/bin/env bash
# benches/compare.sh BASE [--rounds N] [--ids N] [--modes LIST | --sessions [--seconds N]]: what one
# id costs with snowid as built from git revision BASE and as checked out now, beside nextval() and
# gen_random_uuid(), in one run on the major that PG_MAJOR picks (release builds). The two builds are
# installed in turn, BASE first, for --rounds rounds (default 5), each on a fresh server; each round
# times --ids rows (default 2,000,000) of every expression. --modes adds the registry modes, whose
# rounds time snowid_next() alone, each on a fresh server: lease-table (a fixed worker id, the lease
# table on the server; always measured), shared-registry (a fixed worker id, another server of this
# machine as the registry, over its unix socket), any-worker-id (snowid.any_worker_id on that
# registry) and etcd (a fixed worker id, one etcd member on loopback). --sessions measures, in the
# same rounds instead of the cost per id, the ids per second of every expression with 1, 2 and 4
# concurrent sessions (pgbench, --seconds per figure, default 4). Writes
# benches/results/pgMAJOR/compare.md (compare-modes.md with --modes, compare-sessions.md with
# --sessions) and prints it; leaves the checkout's build installed.
set -euo pipefail
usage="usage: benches/compare.sh BASE [--rounds N] [--ids N] [--modes LIST | --sessions [--seconds N]]
  --modes: a comma-separated list of shared-registry, any-worker-id, etcd
  --sessions: ids per second with 1, 2 and 4 sessions, by pgbench, --seconds per figure (default 4)"
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
[ $# -ge 1 ] || usage_error "$usage" "BASE is missing"
base_rev=$1
shift
# --sessions is the one option without a value, which read_options does not know.
sessions= options=()
for option in "$@"; do
    if [ "$option" = --sessions ]; then sessions=1; else options+=("$option"); fi
done
rounds=5 ids=2000000 modes= seconds=
read_options "$usage" --rounds=rounds --ids=ids --modes=modes --seconds=seconds -- "${options[@]}"
[ -z "$seconds" ] || [ -n "$sessions" ] || usage_error "$usage" "--seconds goes with --sessions"
seconds=${seconds:-4}
[ -z "$sessions" ] || [ -z "$modes" ] || usage_error "$usage" "--sessions and --modes are separate runs"
for option in rounds ids seconds; do
    [[ ${!option} =~ ^[1-9][0-9]*$ ]] || usage_error "$usage" "--$option ${!option} is not a positive number"
done
for mode in ${modes//,/ }; do
    case $mode in
    shared-registry | any-worker-id | etcd) ;;
    *) usage_error "$usage" "--modes: $mode is not a registry mode" ;;
    esac
done
prepare build
[[ ,$modes, == *,etcd,* ]] && install_debian_packages etcd-server
cd "$REPO"
base_commit=$(git rev-parse --verify --quiet "$base_rev^{commit}") ||
    usage_error "$usage" "$base_rev is not a commit of this repository"

# package DIR OUT: the release build of the checkout in DIR, laid out under OUT as it installs.
package() {
    echo "==> building $(git -C "$1" log -1 --format='%h %s' | cut -c1-80) (release)" >&2
    (cd "$1" && cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$2" >/dev/null)
}
work=$(mktemp -d)
worktree="$work/base"
dir=${SNOWID_COMPARE_DIR:-/tmp/snowid-compare}
port=${SNOWID_COMPARE_PORT:-54370}
registry_dir=$dir-registry registry_port=$((port + 1))
etcd_dir=$dir-etcd etcd_port=$((port + 2)) etcd_peer_port=$((port + 3))
cleanup() {
    stop_cluster "$dir"
    stop_cluster "$registry_dir"
    [ -f "$etcd_dir/etcd.pid" ] && kill "$(cat "$etcd_dir/etcd.pid")" 2>/dev/null
    if [ -d "$work/head-build" ]; then as_root cp -a "$work/head-build/." /; fi
    git worktree remove --force "$worktree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
git worktree add --detach --quiet "$worktree" "$base_commit"
# The base's build has a target directory of its own, kept for the next comparison.
CARGO_TARGET_DIR="$REPO/target/compare-base" package "$worktree" "$work/base-build"
package "$REPO" "$work/head-build"

# The registries, kept for the whole run: a registry made anew grants nothing until every lease it
# may have lost has run out. Their lease functions are SQL, so the builds swapped under the
# registry server are not loaded by it.
as_root cp -a "$work/head-build/." /
psql=("$("$PG_CONFIG" --bindir)/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d postgres)
if [[ ,$modes, == *,shared-registry,* || ,$modes, == *,any-worker-id,* ]]; then
    start_cluster "$registry_dir" "$registry_port"
    "${psql[@]}" -p "$registry_port" -c "CREATE EXTENSION snowid; SELECT snowid_registry_is_new()" >/dev/null
fi
if [[ ,$modes, == *,etcd,* ]]; then
    rm -rf "$etcd_dir" && mkdir -p "$etcd_dir"
    start_etcd "$etcd_dir" "$etcd_port" "$etcd_peer_port"
fi
registry="snowid.registry = 'host=$registry_dir port=$registry_port dbname=postgres user=postgres'"
# mode_settings MODE: the snowid settings of a server in MODE.
mode_settings() {
    case $1 in
    lease-table) echo "snowid.worker_id = 17" ;;
    shared-registry) printf '%s\n' "snowid.worker_id = 18" "$registry" ;;
    any-worker-id) printf '%s\n' "snowid.any_worker_id = on" "$registry" ;;
    etcd) printf '%s\n' "snowid.worker_id = 19" "snowid.registry = 'etcd://127.0.0.1:$etcd_port/snowid-compare'" ;;
    esac
}

compare=(python3 "$REPO/benches/compare.py")
label_base="base $(git rev-parse --short "$base_commit")"
label_head="checkout $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with changes')"
for round in $(seq "$rounds"); do
    for side in base head; do
        label=label_$side
        as_root cp -a "$work/$side-build/." /
        for mode in lease-table ${modes//,/ }; do
            echo "==> round $round of $rounds: ${!label}, $mode" >&2
            mapfile -t settings < <(mode_settings "$mode")
            start_cluster "$dir" "$port" "shared_preload_libraries = 'snowid'" "${settings[@]}" ||
                { tail -n 3 "$dir/server.log" >&2; exit 1; }
            measure=(measure --mode "$mode" --ids "$ids")
            [ -z "$sessions" ] || measure=(sessions --seconds "$seconds")
            "${compare[@]}" "${measure[@]}" --build "${!label}" --round "$round" \
                --psql "$("$PG_CONFIG" --bindir)/psql" --port "$port" >>"$work/samples.jsonl"
            stop_cluster "$dir"
        done
    done
done
out=compare.md
[ -z "$modes" ] || out=compare-modes.md
[ -z "$sessions" ] || out=compare-sessions.md
"${compare[@]}" report --ids "$ids" --out "$REPO/benches/results/pg$PG_MAJOR/$out" "$work/samples.jsonl"
