#!/usr/bin/env bash
# Installs snowid, starts a throwaway cluster configured for it, and shows ids being made and decoded.
# `scripts/demo.sh stop` stops that cluster.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
prepare build
dir=${SNOWID_DEMO_DIR:-/tmp/snowid-demo}
port=${SNOWID_DEMO_PORT:-54329}
if [ "${1:-}" = stop ]; then
    stop_cluster "$dir"
    exit
fi

install_snowid
echo "==> starting a throwaway cluster in $dir on port $port"
start_cluster "$dir" "$port" "shared_preload_libraries = 'snowid'" "snowid.worker_id = 17" "timezone = 'UTC'"

"$("$PG_CONFIG" --bindir)/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres -e <<'SQL'
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
