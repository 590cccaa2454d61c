# Sourced by scripts/test.sh: remove_leftovers deletes what a killed run of the tests left under the
# temporary directory (servers' data directories, Patroni and etcd directories, loop-mounted volumes,
# the fault schedule's network namespaces) and ends the processes that still run from there, so that
# the next run starts clean. Only what no live run owns: a directory named after a process that no
# longer exists, or a cluster directory whose port no live test holds (tests/cluster/src/lib.rs takes
# each port with an flock on snowid-test-ports/PORT, which the directory is named after).

# leftover_pids DIR: the processes whose command line names a path under DIR (a server's -D, etcd's
# --data-dir, Patroni's configuration file).
leftover_pids() {
    local cmdline args
    for cmdline in /proc/[0-9]*/cmdline; do
        mapfile -d '' args <"$cmdline" 2>/dev/null || continue
        case " ${args[*]}" in
        *[\ =]"$1/"*) cmdline=${cmdline#/proc/}; echo "${cmdline%/cmdline}" ;;
        esac
    done
}

# end_processes PID...: the processes and all their descendants, thawed (a fault may have stopped
# them) and killed together, so that no Patroni restarts a server in between.
end_processes() {
    local all=("$@") next=0
    [ $# -gt 0 ] || return 0
    while [ "$next" -lt ${#all[@]} ]; do
        mapfile -t -O "${#all[@]}" all < <(pgrep -P "${all[$next]}" || true)
        next=$((next + 1))
    done
    as_root kill -CONT "${all[@]}" 2>/dev/null || true
    as_root kill -KILL "${all[@]}" 2>/dev/null || true
}

# leftover PATH: whether PATH, a snowid test directory under the temporary directory, is a killed
# run's.
leftover() {
    local name=${1##*/} lock
    case $name in
    snowid-test-ports | snowid-pgrx-test-*) return 1 ;;
    snowid-cluster-*)
        lock=$tmp/snowid-test-ports/${name##*-}
        [ ! -e "$lock" ] || flock -n "$lock" true ;;
    *)
        [[ $name =~ -([0-9]+)(-patroni|\.img)?$ ]] && ! kill -0 "${BASH_REMATCH[1]}" 2>/dev/null ;;
    esac
}

remove_leftovers() {
    local tmp=${TMPDIR:-/tmp} path netns device pids found=()
    for path in "$tmp"/snowid-*; do
        [ -e "$path" ] && leftover "$path" && found+=("$path")
    done
    for netns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        [[ $netns =~ ^snowid-nemesis-([0-9]+)- ]] && ! kill -0 "${BASH_REMATCH[1]}" 2>/dev/null || continue
        mapfile -t pids < <(ip netns pids "$netns")
        end_processes "${pids[@]}"
        as_root ip netns delete "$netns"
    done
    # Ceilings that nodes of a shared registry keep in memory, not rewritten for a minute: their
    # servers are gone, or hold no lease (one that holds its lease rewrites its own twice a
    # second), and a ceiling gone costs at most a wait at a crash restart. Trusted clocks too: one
    # gone costs a restart's trust in the clock it starts with.
    as_root find /dev/shm -mindepth 2 -maxdepth 2 \( -path '/dev/shm/snowid-*/*.ceiling*' -o -path '/dev/shm/snowid-*/*.clock*' \) -mmin +1 -delete
    [ ${#found[@]} -gt 0 ] || return 0
    echo "==> removing what a killed run left: ${found[*]}"
    for path in "${found[@]}"; do
        if mountpoint -q "$path"; then as_root fsfreeze --unfreeze "$path" 2>/dev/null || true; fi
    done
    # Twice: a Patroni may start its server again between the look and the kill.
    for _ in 1 2; do
        for path in "${found[@]}"; do
            mapfile -t pids < <(leftover_pids "$path")
            end_processes "${pids[@]}"
        done
        sleep 1
    done
    for path in "${found[@]}"; do
        if mountpoint -q "$path"; then as_root umount "$path" || as_root umount -l "$path"; fi
        if [[ $path == *.img ]]; then
            for device in $(as_root losetup -j "$path" -O NAME -n); do as_root losetup -d "$device"; done
        fi
        as_root rm -rf "$path"
    done
}
