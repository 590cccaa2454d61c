#!/usr/bin/env bash
# scripts/nemesis.sh [--seed N] [--minutes M] [--registry postgres|etcd] [--report DIR] [--no-install] [--built]
#
# The fault schedule: four nodes and their registry, each on a test host of its own (a network
# namespace), issue ids for M minutes (3 by default, 180 at most) while faults drawn from seed N
# (at random and printed when not given) strike them; then every id is checked and a report
# written into DIR (target/nemesis/seed-N by default, which must be empty or hold an earlier
# report): report.txt, timeline.png, the faults and the timeline as tables, and on failure every
# call and every server's log. The registry is PostgreSQL with a synchronous standby for an even
# seed, etcd for an odd one, unless --registry names it. Exits 1 when a check failed. Runs against
# PostgreSQL PG_MAJOR (15 by default), into which it installs snowid unless --no-install says that
# is done; it builds the harness (tests/cluster's nemesis) unless --built says that is done. Needs
# root, for the namespaces.
set -euo pipefail

usage="usage: scripts/nemesis.sh [--seed N] [--minutes M] [--registry postgres|etcd] [--report DIR] [--no-install] [--built]"
install=true
build=true
args=()
report=
seed=
while [ $# -gt 0 ]; do
    case $1 in
    --no-install) install=false; shift ;;
    --built) build=false; shift ;;
    --seed) seed=${2:?$usage}; args+=("$1" "$2"); shift 2 ;;
    --report) report=$(realpath -m "${2:?$usage}"); shift 2 ;;
    --minutes | --registry) args+=("$1" "${2:?$usage}"); shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "scripts/nemesis.sh makes network namespaces: run it as root" >&2; exit 2; }
if [ -z "$seed" ]; then
    seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
    args+=(--seed "$seed")
fi

scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$scripts/lib.sh"
prepare test
cd "$REPO"
$install && install_snowid
report=${report:-$REPO/target/nemesis/seed-$seed}

echo "==> PostgreSQL $PG_MAJOR: fault schedule (replay: scripts/nemesis.sh ${args[*]})"
$build && build_nemesis
status=0
PG_CONFIG="$PG_CONFIG" tests/cluster/target/release/nemesis "${args[@]}" --report "$report" || status=$?
# The chart is drawn when it can be; its failure never changes the run's verdict.
if [ -f "$report/timeline.tsv" ]; then
    (install_matplotlib && python3 "$scripts/nemesis-chart.py" "$report") ||
        echo "scripts/nemesis.sh: the chart was not drawn" >&2
fi
exit "$status"
