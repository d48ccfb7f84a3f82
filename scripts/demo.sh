#!/usr/bin/env bash
# The main job, on an embedded default: a nightly ticket-grading batch.
#
# Installs what is missing, builds, starts a throwaway PostgreSQL and a local mock LLM
# endpoint (latency, a rate limit of 1,200 requests a minute for all clients with 429 and
# Retry-After past it, occasional 500 and malformed answers: no internet), creates a tickets
# table, sets a budget "llm" of the same limit, enqueues one grading task per ticket as batch
# nightly-YYYY-MM-DD under that budget, runs two worker processes with
# scripts/grade_ticket.lua and --until-empty while `leash status --watch` shows progress, and
# ends with the batch report and the budget.
# Everything it started is stopped and removed on exit.
#
#   scripts/demo.sh                    # 3,000 tickets
#   LEASH_DEMO_TICKETS=500 scripts/demo.sh
#   scripts/demo.sh --batch-api        # graded through the mock's OpenAI Batch API instead
#                                      # (README "Provider batches"; LEASH_DEMO_BATCH_API=1)
set -euo pipefail
cd "$(dirname "$0")/.."

TICKETS=${LEASH_DEMO_TICKETS:-3000}
SLOTS=${LEASH_DEMO_SLOTS:-24}
BATCH_API=${LEASH_DEMO_BATCH_API:-0}
[[ ${1:-} == --batch-api ]] && BATCH_API=1

# shellcheck source=scripts/deps.sh
source scripts/deps.sh
deps_install

printf '\n==> building\n'
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j2 >/dev/null
LEASH=$PWD/build/leash

printf '\n==> starting a throwaway PostgreSQL and a mock LLM endpoint\n'
mapfile -t pg_vars < <(compgen -e | grep '^PG' || true)
unset DATABASE_URL "${pg_vars[@]}"
eval "$(scripts/pg.sh start)"
work=$(mktemp -d /tmp/leash-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/pg.sh stop "$LEASH_PG_DIR"
  rm -rf "$work"
}
trap cleanup EXIT
DATABASE_URL=$(scripts/pg.sh newdb leash_demo)
export DATABASE_URL

python3 scripts/mock_llm.py --port 0 --latency-ms 20-120 --rpm 1200 --rate-500 0.02 \
  --rate-malformed 0.01 --faults-max-per-prompt 2 --seed 7 --idle-exit 300 --batch-delay-s 5 \
  >"$work/mock.out" 2>"$work/mock.log" &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q '^PORT ' "$work/mock.out" 2>/dev/null && break
  sleep 0.1
done
port=$(sed -n 's/^PORT //p' "$work/mock.out")
[[ -n $port ]] || { echo "demo: the mock LLM did not start" >&2; cat "$work/mock.log" >&2; exit 1; }
llm_url="http://127.0.0.1:$port/v1/chat/completions"
batch_flags=()
if [[ $BATCH_API == 1 ]]; then
  batch_flags=(--llm-batch-url "openai=http://127.0.0.1:$port" --llm-batch-age 2 --llm-batch-poll 1)
fi
echo "mock LLM at $llm_url"

printf '\n==> leash migrate, and %d generated tickets\n' "$TICKETS"
$LEASH migrate
psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" <<SQL
CREATE TABLE tickets (id bigint PRIMARY KEY, subject text NOT NULL, body text NOT NULL);
CREATE TABLE ticket_grades (ticket_id bigint PRIMARY KEY, grade int NOT NULL, reason text,
                            graded_by text, graded_at timestamptz NOT NULL DEFAULT now());
INSERT INTO tickets
SELECT i, (ARRAY['Export fails', 'Login loop', 'Invoice wrong', 'Slow dashboard',
                 'Cannot reset password'])[1 + i % 5] || ' #' || i,
       'Customer ' || i || ' writes: ' ||
       (ARRAY['the CSV export stops at 10,000 rows with error E' || (i % 17),
              'after the update I am sent back to the login page every time',
              'my invoice lists a seat we cancelled last month',
              'the dashboard takes a minute to load since Tuesday',
              'the reset link says it expired although I just asked for it'])[1 + i % 5]
  FROM generate_series(1, $TICKETS) i;
SQL

printf '\n==> a budget for the provider, shared by every worker: the mock'"'"'s own limit\n'
$LEASH budget set llm --rpm 1200

BATCH="nightly-$(date +%F)"
printf '\n==> enqueueing one grading task per ticket as batch %s\n' "$BATCH"
if [[ $BATCH_API == 1 ]]; then
  printf '    (--batch-api: each task asks through the provider batch path; a price for the
'
  printf '    model, so the report shows the batch cost beside the synchronous one)
'
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -c \
    "INSERT INTO agent_work_queue_prices (model, input_per_mtok, output_per_mtok) VALUES ('mock-grader', 0.15, 0.6)"
fi
psql -X -A -t -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" -v url="$llm_url" -v batch_api="$BATCH_API" -f - <<'SQL' |
SELECT json_build_object('payload', json_build_object('ticket_id', id, 'llm_url', :'url',
                                                      'budget', 'llm',
                                                      'batch_api', :'batch_api' = '1'))
  FROM tickets ORDER BY id;
SQL
  $LEASH enqueue --file - --batch "$BATCH" --tenant support --budget llm

printf '\n==> two workers, %d slots each, until the batch has settled\n' "$SLOTS"
for w in 1 2; do
  $LEASH run scripts/grade_ticket.lua --concurrency "$SLOTS" --batch "$BATCH" --until-empty \
    --worker-id "grader-$w" --log-level warn "${batch_flags[@]}" >"$work/worker-$w.out" 2>"$work/worker-$w.log" &
  pids+=($!)
done
$LEASH status --watch --interval 1 --batch "$BATCH" --until-empty
for p in "${pids[@]:1}"; do wait "$p"; done

printf '\n==> leash report --batch %s\n' "$BATCH"
$LEASH report --batch "$BATCH"
printf '\n==> leash budget show llm (a 429 pauses it for both workers; no attempt is spent)\n'
$LEASH budget show llm
printf '\n==> the same totals, counted directly\n'
psql -X -A -t -q -d "$DATABASE_URL" -v batch="$BATCH" -f - <<'SQL'
SELECT format('sql        done %s, dead %s, pending %s, leased %s',
              count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'dead'),
              count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'leased'))
  FROM agent_work_queue WHERE batch = :'batch';
SQL
printf '\n==> grades\n'
psql -X -q -d "$DATABASE_URL" -c \
  "SELECT grade, count(*) AS tickets, (array_agg(reason))[1] AS example_reason
     FROM ticket_grades GROUP BY grade ORDER BY grade"
