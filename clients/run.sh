#!/usr/bin/env bash
# clients/run.sh [--install]
# Installs what the client examples need into gitignored places (target/clients, node_modules), then
# runs each of them against the server that PGHOST, PGPORT, PGUSER and PGDATABASE name; with
# --install, stops once installed.
set -euo pipefail
case "$*" in
"") install_only=false ;;
--install) install_only=true ;;
*) echo "usage: clients/run.sh [--install]" >&2; exit 2 ;;
esac
if ! $install_only; then
  for variable in PGHOST PGPORT PGUSER PGDATABASE; do
    [[ -n ${!variable:-} ]] || { echo "run.sh: set $variable to the server to test against" >&2; exit 2; }
  done
fi
clients=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
target=$(dirname "$clients")/target/clients
export PATH="$HOME/.cargo/bin:$PATH" # where rustup puts cargo

python3 -m venv "$target/venv"
"$target/venv/bin/pip" install --quiet --disable-pip-version-check -r "$clients/python/requirements.txt"
(cd "$clients/node" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
CARGO_TARGET_DIR="$target/rust" cargo build --quiet --locked --manifest-path "$clients/rust/Cargo.toml"
$install_only && exit 0

"$target/venv/bin/python" "$clients/python/psycopg_example.py"
"$target/venv/bin/python" "$clients/python/sqlalchemy_example.py"
"$target/venv/bin/python" "$clients/python/retry_example.py"
node "$clients/node/example.mjs"
"$target/rust/debug/snowid-rust-example"
echo "run.sh: all five examples passed"
