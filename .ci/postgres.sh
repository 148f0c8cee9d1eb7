#!/usr/bin/env bash
# Installs PostgreSQL's server binaries (initdb, pg_ctl, postgres) from Debian's packages when they are missing, so
# tests/bot can start a throwaway server (tests/bot/conftest.py: postgres_server). Safe to run again.
# The tests run the server as the unprivileged user `nobody` (postgres refuses to run as root).
# Call it from .ci/run before `make test`:   bash .ci/postgres.sh
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "postgres.sh: initdb not found and not root: install PostgreSQL (Debian: apt-get install postgresql)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends postgresql
