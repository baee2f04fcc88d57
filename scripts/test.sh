#!/usr/bin/env bash
# Install everything the tests need (venv, packages, PostgreSQL, Chromium) and run them.
# Extra arguments go to pytest (e.g. scripts/test.sh -k store -x).
source "$(dirname "$0")/_env.sh"

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
apt_missing=()
[ -x /usr/bin/chromium ] || apt_missing+=(chromium)
ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 || apt_missing+=(postgresql)
if [ ${#apt_missing[@]} -gt 0 ]; then
  echo "==> apt-get install ${apt_missing[*]}"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi
install_extras "dev"

# A throwaway PostgreSQL cluster on a loopback port, removed on exit.
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGPORT=${PGPORT:-55432}
PGROOT=$(mktemp -d /tmp/logitwatch-pg.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres:postgres "$PGROOT"
echo "==> starting PostgreSQL on 127.0.0.1:$PGPORT"
as_pg "$PGBIN/initdb" -D "$PGROOT/data" -U postgres -A trust -E UTF8 --no-locale >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGROOT/data" -l "$PGROOT/log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $PGROOT -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
  start >/dev/null
trap 'as_pg "$PGBIN/pg_ctl" -D "$PGROOT/data" -m fast stop >/dev/null 2>&1; rm -rf "$PGROOT"' EXIT
export LOGITWATCH_TEST_PG_URL="postgresql+psycopg://postgres@127.0.0.1:$PGPORT/postgres"
export LOGITWATCH_REQUIRE_PG=1 LOGITWATCH_REQUIRE_BROWSER=1 HF_HUB_OFFLINE=1

echo "==> pytest"
.venv/bin/python -m pytest "$@"
