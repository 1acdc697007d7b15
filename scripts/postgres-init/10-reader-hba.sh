#!/usr/bin/env bash
# The analysts' role (catalog_reader) reaches only the catalog's database. PostgreSQL
# lets every role connect to every database whose CONNECT privilege PUBLIC holds (the
# `postgres` database among them), and the per-database guards of migrations 0007, 0022
# and 0028 do not hold there; pg_hba.conf is where a server says who may connect where.
# The postgres image runs this once, when it creates its data directory
# (docker-entrypoint-initdb.d, mounted by docker-compose.yml); for a server of your own,
# run it with PGDATA and POSTGRES_DB set and reload the server. Its lines go first: the
# first line that matches a connection decides. A second run changes nothing.
# Everything runs in a subshell: the image sources scripts that lost their executable bit,
# and neither its shell options nor an early exit may leak into the image's entrypoint.
(
  set -euo pipefail
  hba="${PGDATA:?PGDATA is the server data directory}/pg_hba.conf"
  db="${POSTGRES_DB:-ncat}"
  method="${READER_AUTH_METHOD:-scram-sha-256}"
  if ! grep -q "ncat: catalog_reader" "$hba"; then
    tmp="$(mktemp)"
    {
      echo "# ncat: catalog_reader reaches only the catalog's database ($db)"
      echo "local   $db   catalog_reader                 $method"
      echo "host    $db   catalog_reader   all           $method"
      echo "local   all   catalog_reader                 reject"
      echo "host    all   catalog_reader   all           reject"
      cat "$hba"
    } > "$tmp"
    cat "$tmp" > "$hba"  # in place: the file keeps its owner and mode
    rm -f "$tmp"
  fi
)
