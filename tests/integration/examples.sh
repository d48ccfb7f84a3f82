#!/usr/bin/env bash
# The example scripts (scripts/grade_ticket.lua, summarize_chunks.lua, backfill_embeddings.lua)
# run in the real host, end to end: real PostgreSQL, real HTTP against scripts/mock_llm.py with
# injected 429s, 500s and malformed answers. Their unit specs (tests/lua/*_spec.lua) run them
# under leash.testing; this proves the same scripts hold up under `leash run`.
# Each case prints one "# …: N tasks in S s (R tasks/s)" line.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"
# shellcheck source=tests/integration/mock_common.sh
source "$(dirname "$0")/mock_common.sh"

SCRIPTS=$LEASH_SRC/scripts

# examples_setup: a fresh migrated database.
examples_setup() {
  t_newdb
  expect_exit 0 "$LEASH" migrate
}

_now() { local t=${EPOCHREALTIME/[.,]/}; echo $((10#$t)); }

# report NAME TASKS START_US: prints the throughput line, the attempts it took and what
# the mock answered.
report() {
  local us=$(($(_now) - $3))
  awk -v n="$2" -v us="$us" -v name="$1" \
    'BEGIN { printf "# %s: %d tasks in %.2f s (%.1f tasks/s)\n", name, n, us / 1e6, n / (us / 1e6) }'
  echo "#   attempts per task: $(q "SELECT string_agg(attempts || ' x' || n, ', ' ORDER BY attempts)
                                     FROM (SELECT attempts, count(*) n FROM agent_work_queue GROUP BY 1) a")"
  echo "#   mock answers: $(python3 -c 'import json, sys, urllib.request
print(json.dumps(json.load(urllib.request.urlopen(sys.argv[1], timeout=10))["answers"], sort_keys=True))' "$MOCK/stats")"
}

# 0. Every shipped example passes `leash check`.
case_scripts_pass_leash_check() {
  local s
  for s in grade_ticket summarize_chunks backfill_embeddings; do
    expect_exit 0 "$LEASH" check "$SCRIPTS/$s.lua"
    assert_contains "leash check $s.lua" "$(cat "$T_OUT")" ": ok"
  done
}

# 1. 200 tickets graded against a mock that answers 429 (Retry-After 1), 500 and non-JSON
# content: every ticket graded exactly once (one row each, and the model paid once per
# ticket: the answer is kept in a step across retries); the only dead tasks are the ones
# made to be fatal (two tickets whose model answer is never JSON, two missing tickets).
case_grade_tickets_end_to_end() {
  examples_setup
  start_mock --max-requests 100000 --rate-429 0.15 --rate-500 0.1 --rate-malformed 0.1 --faults-max-per-prompt 2 \
    --latency-ms 2-20 --seed 42
  q "CREATE TABLE tickets (id bigint PRIMARY KEY, subject text, body text);
     CREATE TABLE ticket_grades (ticket_id bigint PRIMARY KEY, grade int NOT NULL,
       reason text, graded_by text, graded_at timestamptz NOT NULL DEFAULT now());
     INSERT INTO tickets
       SELECT i, 'Ticket ' || i, 'Customer ' || i || ' reports: the export to CSV fails with error E' || (i % 17)
         FROM generate_series(1, 200) i;
     INSERT INTO tickets VALUES (201, 'Cursed', 'This one never gets JSON back [mock:malformed]'),
                                (202, 'Cursed too', '[mock:malformed] nor this one')" >/dev/null
  local url=$MOCK/v1/chat/completions
  {
    for i in $(seq 1 202) 9001 9002; do
      printf '{"payload":{"ticket_id":%d,"llm_url":"%s"}}\n' "$i" "$url"
    done
  } >"$T_TMP/tasks.jsonl"
  "$LEASH" enqueue --batch nightly --file "$T_TMP/tasks.jsonl" >/dev/null

  local t0
  t0=$(_now)
  start_worker W "$SCRIPTS/grade_ticket.lua" --concurrency 8 --until-empty --poll-ms 20-100
  assert_worker_exit W 240 0
  report "grade_tickets (8 slots, mock 2-20 ms, 429/500/malformed)" 204 "$t0"

  assert_eq "queue after the batch" "$(status_counts)" "dead=4 done=200"
  assert_eq "graded tickets" "$(q 'SELECT count(*) || $$ $$ || min(ticket_id) || $$ $$ || max(ticket_id) FROM ticket_grades')" "200 1 200"
  assert_eq "grades outside 1..5" "$(q 'SELECT count(*) FROM ticket_grades WHERE grade NOT BETWEEN 1 AND 5')" 0
  assert_eq "results that differ from the stored grade" \
    "$(q "SELECT count(*) FROM agent_work_queue w JOIN ticket_grades g ON g.ticket_id = (w.payload->>'ticket_id')::bigint
           WHERE w.status = 'done' AND (w.result->>'grade')::int IS DISTINCT FROM g.grade")" 0
  assert_eq "dead tasks" \
    "$(q "SELECT string_agg((payload->>'ticket_id') || ':' || attempts || ':' || split_part(last_error, ':', 1), ' ' ORDER BY id)
            FROM agent_work_queue WHERE status = 'dead'")" \
    "201:3:model answer not JSON after 3 attempts 202:3:model answer not JSON after 3 attempts 9001:1:ticket 9001 not found 9002:1:ticket 9002 not found"
  # The faults happened and were retried through …
  local chat=/v1/chat/completions
  (($(mock_stat answers "$chat" 429) > 0)) || fail "the mock answered no 429"
  (($(mock_stat answers "$chat" 500) > 0)) || fail "the mock answered no 500"
  (($(mock_stat answers "$chat" malformed) > 6)) || fail "the mock answered no random malformed content"
  (($(q "SELECT count(*) FROM agent_work_queue WHERE status = 'done' AND attempts > 1") > 0)) ||
    fail "no graded ticket needed a retry"
  (($(mock_stat requests "$chat") >= 200)) || fail "fewer than 200 chat requests"
  # … and each good answer was paid for once: one good answer per graded ticket.
  assert_eq "good chat answers (one per graded ticket)" "$(mock_stat answers "$chat" 200)" 200
  assert_no_sanitizer_reports
}

# 2. 5 documents x 6 chunks: map tasks (2 documents through the mock LLM with faults, 3 with
# the local stand-in) fan in to one reduce per document, which concatenates the chunk
# summaries in order after every map task of its document has finished.
case_summarize_chunks_map_reduce() {
  examples_setup
  start_mock --max-requests 100000 --rate-429 0.2 --rate-500 0.1 --rate-malformed 0.1 --faults-max-per-prompt 2 --seed 7
  q "CREATE TABLE chunk_summaries (doc text, chunk int, summary text, worker text, PRIMARY KEY (doc, chunk));
     CREATE TABLE doc_summaries (doc text PRIMARY KEY, summary text NOT NULL, chunks int NOT NULL,
       updated_at timestamptz NOT NULL DEFAULT now())" >/dev/null
  local d c llm
  for c in 6 5 4 3 2 1; do   # last chunk first: the fan-in must not depend on order
    for d in 1 2 3 4 5; do
      llm=""
      ((d > 2)) || llm=",\"llm_url\":\"$MOCK/v1/chat/completions\""
      printf '{"payload":{"doc":"doc-%d","chunk":%d,"chunks":6,"text":"Chunk %d of document %d: the quarterly report says revenue grew while costs held steady across every region"%s},"shard_key":"doc-%d"}\n' \
        "$d" "$c" "$c" "$d" "$llm" "$d"
    done
  done >"$T_TMP/tasks.jsonl"
  "$LEASH" enqueue --tenant demo --batch docs --file "$T_TMP/tasks.jsonl" >/dev/null

  local t0
  t0=$(_now)
  start_worker W "$SCRIPTS/summarize_chunks.lua" --concurrency 8 --until-empty --poll-ms 20-100
  assert_worker_exit W 240 0
  report "summarize_chunks (30 map + 5 reduce, 8 slots)" 35 "$t0"

  assert_eq "queue after the batch" "$(status_counts)" "done=35"
  assert_eq "chunk summaries" "$(q 'SELECT count(*) FROM chunk_summaries')" 30
  assert_eq "reduce tasks: doc, shard, tenant, batch" \
    "$(q "SELECT string_agg(payload->>'doc' || '/' || shard_key || '/' || tenant_id || '/' || batch, ' ' ORDER BY payload->>'doc')
            FROM agent_work_queue WHERE payload ? 'reduce'")" \
    "doc-1/doc-1/demo/docs doc-2/doc-2/demo/docs doc-3/doc-3/demo/docs doc-4/doc-4/demo/docs doc-5/doc-5/demo/docs"
  assert_eq "documents summarised" "$(q 'SELECT string_agg(doc || $$:$$ || chunks, $$ $$ ORDER BY doc) FROM doc_summaries')" \
    "doc-1:6 doc-2:6 doc-3:6 doc-4:6 doc-5:6"
  assert_eq "document summaries that are not the chunk summaries in order" \
    "$(q "SELECT count(*) FROM doc_summaries d
           WHERE d.summary IS DISTINCT FROM (SELECT string_agg(summary, E'\n' ORDER BY chunk)
                                               FROM chunk_summaries c WHERE c.doc = d.doc)")" 0
  # Line i of each document summary comes from chunk i (both paths keep the chunk's
  # first words: "Chunk i of document d: …").
  assert_eq "lines out of order" \
    "$(q "SELECT count(*) FROM doc_summaries d, generate_series(1, 6) i
           WHERE split_part(d.summary, E'\n', i) NOT LIKE 'Chunk ' || i || ' of document ' || substr(d.doc, 5) || ':%'")" 0
  assert_eq "reduces that started before a map task of their document finished" \
    "$(q "SELECT count(*) FROM agent_work_queue r JOIN agent_work_queue m
             ON m.shard_key = r.shard_key AND NOT m.payload ? 'reduce'
          WHERE r.payload ? 'reduce' AND r.started_at < m.finished_at")" 0
  (($(mock_stat answers /v1/chat/completions 200) == 12)) ||
    fail "want 12 good answers (2 documents x 6 chunks, each paid once), got $(mock_stat answers /v1/chat/completions 200)"
  (($(q "SELECT count(*) FROM agent_work_queue WHERE attempts > 1") > 0)) || fail "no map task was retried"
  assert_no_sanitizer_reports
}

# 2b. The other fan-in: a document's task enqueues its chunks as children and waits for them
# (leash.wait{children = true}), then reduces. 4 documents of 10 chunks and one of 1,000, two
# processes of 4 slots: each document task runs twice and spends one attempt, holds no lease
# while its chunks run (the 1,000-chunk one is seen waiting with nothing leased of its own),
# and its summary is its chunks' in order; chunks ending in 3 retry once (the stand-in).
case_summarize_chunks_documents_wait_for_their_chunks() {
  examples_setup
  q "CREATE TABLE chunk_summaries (doc text, chunk int, summary text, worker text, PRIMARY KEY (doc, chunk));
     CREATE TABLE doc_summaries (doc text PRIMARY KEY, summary text NOT NULL, chunks int NOT NULL,
       updated_at timestamptz NOT NULL DEFAULT now())" >/dev/null
  python3 - "$T_TMP/docs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for d, n in (("big", 1000), ("a", 10), ("b", 10), ("c", 10), ("d", 10)):
        texts = ["Chunk %d of %s: revenue grew while costs held steady in every region" % (i, d)
                 for i in range(1, n + 1)]
        f.write(json.dumps({"payload": {"doc": d, "texts": texts}, "shard_key": d}) + "\n")
PY
  "$LEASH" enqueue --tenant demo --batch docs --file "$T_TMP/docs.jsonl" >/dev/null
  local big t0
  big=$(q "SELECT id FROM agent_work_queue WHERE payload->>'doc' = 'big'")
  t0=$(_now)
  start_worker W "$SCRIPTS/summarize_chunks.lua" --concurrency 4 --until-empty --poll-ms 20-100
  start_worker V "$SCRIPTS/summarize_chunks.lua" --concurrency 4 --until-empty --poll-ms 20-100
  wait_for "the 1,000-chunk document to wait" 60 q_true \
    "SELECT status = 'pending' AND last_cause = 'waiting' AND locked_until IS NULL
       FROM agent_work_queue WHERE id = $big"
  assert_eq "while it waits (attempts|children|status|lease held)" \
    "$(q "SELECT attempts || '|' || (SELECT count(*) FROM agent_work_queue c WHERE c.parent_id = q.id)
              || '|' || status || '|' || (locked_until IS NOT NULL)
            FROM agent_work_queue q WHERE id = $big")" \
    "0|1000|pending|false"
  assert_worker_exit W 240 0
  assert_worker_exit V 240 0
  report "summarize_chunks documents (5 documents waiting for 1,040 chunks, 2 x 4 slots)" 1045 "$t0"
  assert_eq "queue after the batch" "$(status_counts)" "done=1045"
  assert_eq "documents summarised (doc:chunks)" \
    "$(q 'SELECT string_agg(doc || $$:$$ || chunks, $$ $$ ORDER BY doc) FROM doc_summaries')" \
    "a:10 b:10 big:1000 c:10 d:10"
  assert_eq "document summaries that are not their chunk summaries in order" \
    "$(q "SELECT count(*) FROM doc_summaries d
           WHERE d.summary IS DISTINCT FROM (SELECT string_agg(summary, E'\n' ORDER BY chunk)
                                               FROM chunk_summaries c WHERE c.doc = d.doc)")" 0
  assert_eq "document tasks' history (attempt:kind, one line per document)" \
    "$(q "SELECT string_agg(h, ' ' ORDER BY h) FROM (
            SELECT string_agg(a.attempt || ':' || a.kind, ',' ORDER BY a.finished_at) h
              FROM agent_work_queue q JOIN agent_work_queue_attempts a ON a.task_id = q.id
             WHERE q.payload ? 'texts' GROUP BY q.id) x")" \
    "1:wait,1:done 1:wait,1:done 1:wait,1:done 1:wait,1:done 1:wait,1:done"
  assert_eq "chunks on a shard of their own" \
    "$(q "SELECT count(*) FROM agent_work_queue WHERE parent_id IS NOT NULL
             AND shard_key = (payload->>'doc') || '#' || (payload->>'chunk')")" 1040
  assert_eq "chunks retried (ending in 3: 100 + 4 x 1)" \
    "$(q "SELECT count(*) FROM agent_work_queue WHERE parent_id IS NOT NULL AND attempts = 2")" 104
  assert_no_sanitizer_reports
}

# 3. 300 documents, batch_size 50: one task becomes a chain of 7 (6 full batches and the
# last, empty one); every row gets its 8-dimensional vector, each batch paid for once.
case_backfill_embeddings_drains() {
  examples_setup
  start_mock --max-requests 100000 --rate-429 0.2 --rate-500 0.2 --faults-max-per-prompt 2 --latency-ms 5-20 --seed 3
  q "CREATE TABLE documents (id bigint PRIMARY KEY, body text, embedding float8[]);
     INSERT INTO documents SELECT i, 'document ' || i || ' about topic ' || (i % 13) FROM generate_series(1, 300) i" >/dev/null
  "$LEASH" enqueue --shard backfill "{\"batch_size\":50,\"llm_url\":\"$MOCK/v1/embeddings\"}" >/dev/null

  local t0
  t0=$(_now)
  start_worker W "$SCRIPTS/backfill_embeddings.lua" --concurrency 4 --until-empty --poll-ms 20-100
  assert_worker_exit W 240 0
  report "backfill_embeddings (300 rows, batches of 50)" 7 "$t0"

  assert_eq "queue after the chain" "$(status_counts)" "done=7"
  assert_eq "rows without an embedding" "$(q 'SELECT count(*) FROM documents WHERE embedding IS NULL')" 0
  assert_eq "vector lengths" "$(q 'SELECT string_agg(DISTINCT array_length(embedding, 1)::text, $$,$$) FROM documents')" 8
  assert_eq "rows embedded per task, in chain order" \
    "$(q "SELECT string_agg(result->>'embedded', ' ' ORDER BY id) FROM agent_work_queue")" "50 50 50 50 50 50 0"
  assert_eq "shard of every link" "$(q 'SELECT string_agg(DISTINCT shard_key, $$,$$) FROM agent_work_queue')" backfill
  assert_eq "good embedding answers (one per batch)" "$(mock_stat answers /v1/embeddings 200)" 6
  (($(mock_stat answers /v1/embeddings 429) + $(mock_stat answers /v1/embeddings 500) > 0)) ||
    fail "the mock injected no fault"
  # Every digit made it from the endpoint's JSON to float8[]: row 1 as the mock computes it.
  local want
  want=$(PYTHONDONTWRITEBYTECODE=1 python3 - "$SCRIPTS/mock_llm.py" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("mock_llm", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
print("{" + ",".join(repr(x) for x in m.embedding("document 1 about topic 1")) + "}")
PY
)
  assert_eq "vector of row 1" "$(q 'SELECT embedding FROM documents WHERE id = 1')" "$want"
  assert_no_sanitizer_reports
}

t_run "$@"
