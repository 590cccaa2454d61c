#!/usr/bin/env bash
# scripts/setup.sh [build|test]: installs what building snowid needs, or also what testing it needs
# (the default), and makes the PostgreSQL major PG_MAJOR names ready (see scripts/lib.sh).
set -euo pipefail
purpose=${1:-test}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
prepare "$purpose"
