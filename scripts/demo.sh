#!/usr/bin/env bash
# The quick start: installs what is missing, builds, starts a throwaway PostgreSQL, migrates,
# enqueues a batch of chunk-summary tasks, drains it with two worker processes
# (--until-empty), prints the batch's status, and cleans up everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/deps.sh
source scripts/deps.sh
deps_install

printf '\n==> building\n'
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j2 >/dev/null
LEASH=build/leash

printf '\n==> starting a throwaway PostgreSQL\n'
mapfile -t pg_vars < <(compgen -e | grep '^PG' || true)
unset DATABASE_URL "${pg_vars[@]}"
eval "$(scripts/pg.sh start)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  scripts/pg.sh stop "$LEASH_PG_DIR"
}
trap cleanup EXIT
DATABASE_URL=$(scripts/pg.sh newdb leash_demo)
export DATABASE_URL

printf '\n==> leash migrate\n'
$LEASH migrate
psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c \
  "CREATE TABLE chunk_summaries (doc text, chunk int, summary text, worker text,
                                 PRIMARY KEY (doc, chunk))"

BATCH="demo-$(date +%F)"
DOCS=${LEASH_DEMO_DOCS:-30}
CHUNKS=${LEASH_DEMO_CHUNKS:-10}
printf '\n==> enqueueing %d documents x %d chunks as batch %s\n' "$DOCS" "$CHUNKS" "$BATCH"
for d in $(seq 1 "$DOCS"); do
  for c in $(seq 1 "$CHUNKS"); do
    printf '{"payload":{"doc":"doc-%d","chunk":%d,"text":"Chunk %d of document %d: the quarterly report says revenue grew while costs held steady across every region we track"},"shard_key":"doc-%d"}\n' \
      "$d" "$((d * 100 + c))" "$c" "$d" "$d"
  done
done | $LEASH enqueue --file - --batch "$BATCH" --tenant demo

printf '\n==> two workers, 8 slots each, until the batch has settled\n'
for w in 1 2; do
  $LEASH run scripts/summarize_chunks.lua --concurrency 8 --batch "$BATCH" --until-empty \
    --worker-id "demo-worker-$w" --log-level warn &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
pids=()

printf '\n==> leash status --batch %s\n' "$BATCH"
$LEASH status --batch "$BATCH"
printf '\n==> a few summaries\n'
psql -X -q -d "$DATABASE_URL" -c \
  "SELECT doc, chunk, summary, worker FROM chunk_summaries ORDER BY doc, chunk LIMIT 5"
psql -X -q -d "$DATABASE_URL" -c \
  "SELECT worker, count(*) AS chunks FROM chunk_summaries GROUP BY 1 ORDER BY 1"
