#!/usr/bin/env bash
# benches/compare.sh BASE [--rounds N] [--ids N]: what one id costs with snowid as built from git
# revision BASE and as checked out now, beside nextval() and gen_random_uuid(), in one run on the
# major that PG_MAJOR picks (release builds). The two builds are installed in turn, BASE first, for
# --rounds rounds (default 5), each on a fresh server; each round times --ids rows (default
# 2,000,000) of every expression. Writes benches/results/pgMAJOR/compare.md and prints it; leaves
# the checkout's build installed.
set -euo pipefail
usage="usage: benches/compare.sh BASE [--rounds N] [--ids N]"
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
[ $# -ge 1 ] || usage_error "$usage" "BASE is missing"
base_rev=$1
shift
rounds=5 ids=2000000
read_options "$usage" --rounds=rounds --ids=ids -- "$@"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage_error "$usage" "--rounds $rounds is not a positive number"
[[ $ids =~ ^[1-9][0-9]*$ ]] || usage_error "$usage" "--ids $ids is not a positive number"
prepare build
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
cleanup() {
    stop_cluster "$dir"
    if [ -d "$work/head-build" ]; then as_root cp -a "$work/head-build/." /; fi
    git worktree remove --force "$worktree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
git worktree add --detach --quiet "$worktree" "$base_commit"
# The base's build has a target directory of its own, kept for the next comparison.
CARGO_TARGET_DIR="$REPO/target/compare-base" package "$worktree" "$work/base-build"
package "$REPO" "$work/head-build"

compare=(python3 "$REPO/benches/compare.py")
label_base="base $(git rev-parse --short "$base_commit")"
label_head="checkout $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with changes')"
for round in $(seq "$rounds"); do
    for side in base head; do
        label=label_$side
        echo "==> round $round of $rounds: ${!label}" >&2
        as_root cp -a "$work/$side-build/." /
        start_cluster "$dir" "$port" "shared_preload_libraries = 'snowid'" "snowid.worker_id = 17" ||
            { tail -n 3 "$dir/server.log" >&2; exit 1; }
        "${compare[@]}" measure --build "${!label}" --round "$round" --ids "$ids" \
            --psql "$("$PG_CONFIG" --bindir)/psql" --port "$port" >>"$work/samples.jsonl"
        stop_cluster "$dir"
    done
done
"${compare[@]}" report --ids "$ids" --out "$REPO/benches/results/pg$PG_MAJOR/compare.md" "$work/samples.jsonl"
