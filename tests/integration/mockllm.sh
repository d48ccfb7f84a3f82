#!/usr/bin/env bash
# scripts/mock_llm.py behaves like the providers it stands in for: a global requests and
# tokens limit shared by every client (sliding window), 429 with Retry-After and the
# rate-limit headers of each shape, usage in both shapes with predictable token counts,
# outage windows (flags and /_control) and /_stats. No database: the mock alone.
source "$(dirname "$0")/../lib.sh"

MOCK_PY=$LEASH_SRC/scripts/mock_llm.py
CLIENT=$LEASH_SRC/tests/fixtures/mock/client.py
CHAT=/v1/chat/completions
MSGS=/v1/messages
EMB=/v1/embeddings
export PYTHONDONTWRITEBYTECODE=1

# start_mock [OPTIONS...]: the mock on a free port, killed at exit; sets MOCK (its URL) and
# MOCK_T0 (wall time at which it printed its port) and MOCK_PID.
start_mock() {
  python3 "$MOCK_PY" --port 0 --idle-exit 120 "$@" >"$T_TMP/mock.out" 2>"$T_TMP/mock.log" &
  MOCK_PID=$!
  t_on_exit t_kill "$MOCK_PID"
  wait_for "the mock to print its port" 20 grep -q '^PORT [0-9]' "$T_TMP/mock.out"
  MOCK_T0=$EPOCHREALTIME
  MOCK=http://127.0.0.1:$(sed -n '1s/^PORT //p' "$T_TMP/mock.out")
}

# post PATH BODY: one request; status in $T_TMP/status, headers (lower-cased names) in
# $T_TMP/headers, body in $T_TMP/body.
post() {
  curl -s -m 30 -X POST -H 'Content-Type: application/json' --data-binary "$2" \
    -D "$T_TMP/headers.raw" -o "$T_TMP/body" -w '%{http_code}' "$MOCK$1" >"$T_TMP/status" ||
    fail "curl $1 failed"
  tr -d '\r' <"$T_TMP/headers.raw" | awk -F': ' 'NR > 1 && NF >= 2 { print tolower($1) ": " substr($0, length($1) + 3) }' >"$T_TMP/headers"
}
status() { cat "$T_TMP/status"; }
# header NAME: the value of a header of the last answer (empty when absent).
header() { awk -F': ' -v n="$1" '$1 == n { print substr($0, length($1) + 3) }' "$T_TMP/headers"; }
body() { jq -c "$@" "$T_TMP/body"; }
stats() { curl -s -m 10 "$MOCK/_stats" | jq -c "$@"; }
control() { post /_control "$1"; }

# tokens TEXT: the mock's count, (UTF-8 bytes + 3) / 4.
tokens() { local n; n=$(printf '%s' "$1" | wc -c); echo $(((n + 3) / 4)); }

chat_body() { jq -cn --arg c "$1" '{model: "m", messages: [{role: "user", content: $c}]}'; }

case_usage_counts_are_four_bytes_a_token_in_both_shapes() {
  start_mock
  local prompt="Please grade this answer: the sky is blue — ünïcode counts as bytes"
  post "$CHAT" "$(chat_body "$prompt")"
  assert_eq "chat answered" "$(status)" 200
  local content pt ct
  content=$(jq -r '.choices[0].message.content' "$T_TMP/body")
  pt=$(tokens "$prompt") ct=$(tokens "$content")
  assert_eq "prompt_tokens" "$(body .usage.prompt_tokens)" "$pt"
  assert_eq "completion_tokens" "$(body .usage.completion_tokens)" "$ct"
  assert_eq "total_tokens" "$(body .usage.total_tokens)" $((pt + ct))
  # Two messages are joined by a newline, as the content hash always did.
  post "$CHAT" '{"messages":[{"role":"system","content":"abcd"},{"role":"user","content":"efgh"}]}'
  assert_eq "two messages" "$(body .usage.prompt_tokens)" "$(tokens $'abcd\nefgh')"
  # Anthropic: system first, content as a string or as text blocks; the same content as chat.
  post "$MSGS" "$(jq -cn --arg c "$prompt" '{model: "m", max_tokens: 100, messages: [{role: "user", content: $c}]}')"
  assert_eq "messages answered" "$(status)" 200
  assert_eq "input_tokens" "$(body .usage.input_tokens)" "$pt"
  assert_eq "output_tokens" "$(body .usage.output_tokens)" "$ct"
  assert_eq "the same content as chat" "$(jq -r '.content[0].text' "$T_TMP/body")" "$content"
  assert_eq "message shape" "$(body '[.type, .role, .content[0].type, .stop_reason]')" '["message","assistant","text","end_turn"]'
  post "$MSGS" '{"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]}]}'
  assert_eq "system and blocks" "$(body .usage.input_tokens)" "$(tokens $'be brief\none\ntwo')"
  post "$EMB" '{"input":["abcdefgh","ijk"]}'
  assert_eq "embedding tokens" "$(body '[.usage.prompt_tokens, .usage.total_tokens]')" "[3,3]"
  # Bad Anthropic bodies are 400s in Anthropic's error shape.
  local bad
  for bad in '{}' '{"messages":[]}' '{"messages":[{"role":"user","content":5}]}' \
             '{"messages":[{"role":"user","content":[{"type":"image"}]}]}' \
             '{"system":7,"messages":[{"role":"user","content":"x"}]}'; do
    post "$MSGS" "$bad"
    assert_eq "400 for $bad" "$(status)" 400
    assert_eq "Anthropic error shape for $bad" "$(body '[.type, .error.type]')" '["error","invalid_request_error"]'
  done
  assert_eq "usage summed in /_stats" "$(stats .tokens.prompt)" \
    $((pt + $(tokens $'abcd\nefgh') + pt + $(tokens $'be brief\none\ntwo') + 3))
}

# check_window FILE RPM TPM WINDOW: from the clients' own records (several processes), no
# window of the server can have admitted more than the limits. A 200 was admitted between
# its "sent" and "got"; so any RPM + 1 answers of 200 must have been sent and received far
# enough apart: the last one's "got" minus the first one's "sent" >= WINDOW. Prints the
# figures as JSON.
check_window() {
  python3 - "$@" <<'PY'
import json, sys
path, rpm, tpm, window, tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
rows = [json.loads(l) for l in open(path)]
ok = sorted((r for r in rows if r["status"] == 200), key=lambda r: r["got"])
bad = []
if rpm:
    by_sent = sorted(ok, key=lambda r: r["sent"])
    for i in range(len(by_sent) - rpm):
        first, group = by_sent[i], by_sent[i:i + rpm + 1]
        last_got = max(r["got"] for r in group)
        if last_got - first["sent"] < window:
            bad.append("%d answers of 200 within %.3fs" % (rpm + 1, last_got - first["sent"]))
            break
if tpm:
    per = tpm // tok + 1          # answers whose tokens together pass the limit
    by_sent = sorted(ok, key=lambda r: r["sent"])
    for i in range(len(by_sent) - per + 1):
        group = by_sent[i:i + per]
        if max(r["got"] for r in group) - group[0]["sent"] < window:
            bad.append("%d answers of %d tokens within %.3fs" % (per, tok, max(r["got"] for r in group) - group[0]["sent"]))
            break
limited = [r for r in rows if r["status"] == 429]
ra_ok = all(r["headers"].get("retry-after", "").isdigit() and int(r["headers"]["retry-after"]) >= 1 for r in limited)
print(json.dumps({"ok": len(ok), "limited": len(limited), "violations": bad, "retry_after_ok": ra_ok}))
PY
}

# run_clients N THREADS DURATION PATH BODY: N client processes at once; their records
# end up together in $T_TMP/all.jsonl.
run_clients() {
  local n=$1 threads=$2 dur=$3 path=$4 body=$5 i pids=()
  for ((i = 0; i < n; i++)); do
    python3 "$CLIENT" "$MOCK" "$path" "$dur" "$threads" "$T_TMP/client$i.jsonl" "$body" &
    pids+=("$!")
  done
  for i in "${pids[@]}"; do wait "$i" || fail "a client failed"; done
  cat "$T_TMP"/client*.jsonl >"$T_TMP/all.jsonl"
}

case_the_request_limit_holds_for_three_client_processes_together() {
  local rpm=15 window=2
  start_mock --rpm $rpm --window-s $window
  run_clients 3 2 5 "$CHAT" "$(chat_body "hello there")"
  local fig
  fig=$(check_window "$T_TMP/all.jsonl" $rpm 0 $window 0)
  echo "# figures: $fig" >&2
  assert_eq "no window held more than $rpm (clients' view)" "$(jq -c .violations <<<"$fig")" "[]"
  assert_eq "every 429 had Retry-After >= 1" "$(jq -c .retry_after_ok <<<"$fig")" true
  (($(jq .limited <<<"$fig") > 0)) || fail "no 429: the clients never reached the limit ($fig)"
  # The limit was reached, not just respected: at least the first window's worth got through.
  (($(jq .ok <<<"$fig") >= rpm)) || fail "fewer than $rpm answers of 200 ($fig)"
  assert_eq "the mock's own peak" "$(stats .window.max_requests)" $rpm
  assert_eq "the mock counted the clients' 429s" "$(stats .limited.requests)" "$(jq .limited <<<"$fig")"
  assert_eq "and their 200s" "$(stats .admitted)" "$(jq .ok <<<"$fig")"
}

case_the_token_limit_holds_for_three_client_processes_together() {
  local tpm=400 window=2 body tok
  body=$(chat_body "count my tokens please")
  start_mock --tpm $tpm --window-s $window
  post "$CHAT" "$body"
  tok=$(body .usage.total_tokens)
  ((tok > 10)) || fail "a request costs $tok tokens"
  run_clients 3 2 5 "$CHAT" "$body"
  local fig
  fig=$(check_window "$T_TMP/all.jsonl" 0 $tpm $window "$tok")
  echo "# figures: $fig ($tok tokens a request)" >&2
  assert_eq "no window held more than $tpm tokens (clients' view)" "$(jq -c .violations <<<"$fig")" "[]"
  (($(jq .limited <<<"$fig") > 0)) || fail "no 429 ($fig)"
  (($(stats .window.max_tokens) <= tpm)) || fail "the mock's peak passed the limit: $(stats .window)"
  (($(stats .limited.tokens) > 0)) || fail "no 429 counted as tokens"
  assert_eq "charged what usage said" "$(stats .charged_tokens)" "$(stats .tokens.total)"
  # A request that could never fit is a 400, not a 429 to retry forever.
  post "$CHAT" "$(chat_body "$(head -c 2000 /dev/zero | tr '\0' x)")"
  assert_eq "too large for the limit" "$(status)" 400
  assert_contains "says why" "$(body .error.message)" "more than the limit of $tpm"
}

case_limit_answers_carry_the_headers_of_their_shape() {
  start_mock --rpm 2 --tpm 100000 --window-s 30
  post "$CHAT" "$(chat_body a)"
  assert_eq "first" "$(status)" 200
  assert_eq "limit" "$(header x-ratelimit-limit-requests)" 2
  assert_eq "remaining after one" "$(header x-ratelimit-remaining-requests)" 1
  assert_eq "token limit" "$(header x-ratelimit-limit-tokens)" 100000
  assert_eq "tokens remaining" "$(header x-ratelimit-remaining-tokens)" $((100000 - $(body .usage.total_tokens)))
  [[ $(header x-ratelimit-reset-requests) =~ ^(30s|29\.[0-9]+s)$ ]] ||
    fail "reset is a duration like OpenAI's: $(header x-ratelimit-reset-requests)"
  post "$EMB" '{"input":"b"}'
  assert_eq "embeddings share the limit" "$(header x-ratelimit-remaining-requests)" 0
  post "$CHAT" "$(chat_body c)"
  assert_eq "third is refused" "$(status)" 429
  local ra
  ra=$(header retry-after)
  if ! [[ $ra =~ ^[0-9]+$ ]] || ((ra < 1 || ra > 30)); then
    fail "Retry-After in whole seconds up to the window: '$ra'"
  fi
  assert_eq "remaining on the 429" "$(header x-ratelimit-remaining-requests)" 0
  assert_eq "OpenAI error type" "$(body .error.type)" '"rate_limit"'
  # Anthropic shape: its own header names, resets as RFC 3339 times, lower-case retry-after.
  post "$MSGS" '{"messages":[{"role":"user","content":"d"}]}'
  assert_eq "messages refused too" "$(status)" 429
  assert_eq "anthropic limit" "$(header anthropic-ratelimit-requests-limit)" 2
  assert_eq "anthropic remaining" "$(header anthropic-ratelimit-requests-remaining)" 0
  assert_eq "anthropic tokens limit" "$(header anthropic-ratelimit-tokens-limit)" 100000
  assert_eq "no OpenAI names on Anthropic answers" "$(header x-ratelimit-limit-requests)" ""
  local reset now
  reset=$(header anthropic-ratelimit-requests-reset)
  [[ $reset =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$ ]] || fail "RFC 3339 reset: '$reset'"
  now=$(date -u +%s)
  reset=$(date -u -d "$reset" +%s)
  ((reset >= now && reset <= now + 31)) || fail "reset $reset is not within the window from $now"
  assert_eq "Anthropic error shape" "$(body '[.type, .error.type]')" '["error","rate_limit_error"]'
  [[ $(header retry-after) =~ ^[0-9]+$ ]] || fail "retry-after on Anthropic's 429"
  # Retry-After as an HTTP-date, then left out (the reset headers must do).
  control '{"retry_after_format":"date"}'
  post "$CHAT" "$(chat_body e)"
  ra=$(header retry-after)
  [[ $ra =~ ^[A-Z][a-z]{2},\ [0-9]{2}\ [A-Z][a-z]{2}\ [0-9]{4}\ [0-9]{2}:[0-9]{2}:[0-9]{2}\ GMT$ ]] ||
    fail "Retry-After as an HTTP-date: '$ra'"
  ra=$(date -u -d "$ra" +%s)
  now=$(date -u +%s)
  ((ra > now - 1 && ra <= now + 31)) || fail "HTTP-date $ra is not within the window from $now"
  control '{"retry_after_format":"none"}'
  post "$CHAT" "$(chat_body f)"
  assert_eq "still refused" "$(cat "$T_TMP/status")" 429
  assert_eq "no Retry-After" "$(header retry-after)" ""
  [[ -n $(header x-ratelimit-reset-requests) ]] || fail "the reset header stays"
  # No limits: no rate-limit headers at all.
  control '{"rpm":0,"tpm":0}'
  post "$CHAT" "$(chat_body g)"
  assert_eq "limits lifted at run time" "$(status)" 200
  assert_eq "no headers without limits" "$(grep -c ratelimit "$T_TMP/headers" || true)" 0
}

case_the_date_format_flag_and_the_fault_429s_use_it() {
  start_mock --rate-429 1 --retry-after-format date
  post "$CHAT" "$(chat_body a)"
  assert_eq "an injected 429" "$(status)" 429
  [[ $(header retry-after) == *GMT ]] || fail "injected faults use the format too: '$(header retry-after)'"
}

case_an_outage_planned_at_start_refuses_everything_until_it_ends() {
  # 6 s: long enough that the first requests land inside it even on a loaded machine.
  start_mock --outage 0+6 --outage-retry-after 60 --rpm 100
  post "$CHAT" "$(chat_body a)"
  assert_eq "refused during the outage" "$(status)" 429
  assert_eq "Retry-After of the outage" "$(header retry-after)" 60
  assert_eq "the limits were not charged" "$(header x-ratelimit-remaining-requests)" 100
  post "$MSGS" '{"messages":[{"role":"user","content":"b"}]}'
  assert_eq "messages refused" "$(status)" 429
  post "$EMB" '{"input":"c"}'
  assert_eq "embeddings refused" "$(status)" 429
  assert_eq "/_stats says so" "$(stats '.outage.active')" true
  # It ends by itself.
  # shellcheck disable=SC2016 # eval expands it, each try
  wait_for "the outage to end" 40 eval 'post "$CHAT" "$(chat_body a)"; [[ $(status) == 200 ]]'
  assert_eq "no 200 before the 6 s were over" \
    "$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]) >= 5.9)" "$MOCK_T0" "$EPOCHREALTIME")" True
  (($(stats .outage_refused) >= 3)) || fail "refusals counted: $(stats .outage_refused)"
  assert_eq "refusals are not admitted" "$(stats .admitted)" 1
}

case_an_outage_started_by_control_refuses_every_shape_and_stops_on_request() {
  start_mock --rpm 100 --rate-500 0
  post "$CHAT" "$(chat_body before)"
  assert_eq "before" "$(status)" 200
  control '{"outage_s":600,"retry_after":60}'
  assert_eq "control accepted" "$(status)" 200
  assert_eq "control answers the state" "$(body '[.outage.active, .outage.retry_after]')" '[true,60]'
  local p
  for p in "$CHAT" "$EMB"; do
    post "$p" '{"messages":[{"role":"user","content":"x"}],"input":"x"}'
    assert_eq "$p refused" "$(status)" 429
    assert_eq "$p Retry-After" "$(header retry-after)" 60
  done
  post "$MSGS" '{"messages":[{"role":"user","content":"x"}]}'
  assert_eq "messages refused" "$(status)" 429
  assert_eq "messages retry-after" "$(header retry-after)" 60
  # 503 instead, and without retry_after: the seconds left in the outage.
  control '{"outage_s":120,"status":503}'
  post "$CHAT" "$(chat_body x)"
  assert_eq "503" "$(status)" 503
  local ra
  ra=$(header retry-after)
  ((ra >= 100 && ra <= 120)) || fail "Retry-After is the time left (<= 120): $ra"
  post "$MSGS" '{"messages":[{"role":"user","content":"x"}]}'
  assert_eq "Anthropic's overloaded shape" "$(body .error.type)" '"overloaded_error"'
  control '{"outage_s":0}'
  post "$CHAT" "$(chat_body after)"
  assert_eq "over on request" "$(status)" 200
  assert_eq "per_minute figures" "$(stats '.per_minute[0] | [.requests, .admitted, .ok, ."429", ."503"]')" "[7,2,2,3,2]"
  assert_eq "answers by path" "$(stats '.answers["/v1/chat/completions"]')" '{"200":2,"429":1,"503":1}'
}

case_an_outage_of_one_endpoint_lets_the_others_flow() {
  start_mock --outage 0+600 --outage-path "$CHAT" --outage-retry-after 60
  post "$CHAT" "$(chat_body a)"
  assert_eq "the chat endpoint is down" "$(status)" 429
  post "$MSGS" '{"messages":[{"role":"user","content":"b"}]}'
  assert_eq "messages flow" "$(status)" 200
  post "$EMB" '{"input":"c"}'
  assert_eq "embeddings flow" "$(status)" 200
  control "{\"paths\":[\"$MSGS\"]}"
  post "$CHAT" "$(chat_body a)"
  assert_eq "chat flows once the outage moved" "$(status)" 200
  post "$MSGS" '{"messages":[{"role":"user","content":"b"}]}'
  assert_eq "messages are down now" "$(status)" 429
  control '{"paths":["/v1/nope"]}'
  assert_eq "an unknown path is refused" "$(status)" 400
  control '{"paths":[]}'
  post "$EMB" '{"input":"c"}'
  assert_eq "[] is every endpoint again" "$(status)" 429
}

case_control_refuses_bad_requests_and_changes_nothing() {
  start_mock --rpm 5
  local before bad
  before=$(stats '[.limits, .outage, .retry_after_format]')
  for bad in '{"outage":5}' '{"outage_s":-1}' '{"outage_s":"5"}' '{"outage_s":true}' \
             '{"rpm":1.5}' '{"rpm":-3}' '{"status":500}' '{"retry_after_format":"iso"}' \
             '{"paths":"/v1/messages"}' '{"paths":[1]}' \
             '[1]' 'not json' '{"outage_s":1e999}' '{"rpm":3,"bogus":1}'; do
    control "$bad"
    assert_eq "400 for $bad" "$(status)" 400
    [[ -n $(body .error.message) ]] || fail "no message for $bad"
  done
  assert_eq "nothing changed" "$(stats '[.limits, .outage, .retry_after_format]')" "$before"
  assert_eq "control is not a request" "$(stats .total)" 0
}

case_bad_flags_exit_2_with_one_line() {
  local bad
  for bad in "--rpm -1" "--tpm x" "--window-s 0" "--outage 5" "--outage -1+5" "--outage 1+0" \
             "--outage-status 500" "--retry-after-format iso" "--outage-retry-after -2" \
             "--outage-path /v1/nope" "--batch-delay-s -1" "--batch-delay-s inf" "--batch-fail-rate 2" \
             "--batch-fail-rate x" "--batch-expire-done -0.5" "--batch-refuse -1" \
             "--batch-refuse-status 404"; do
    # shellcheck disable=SC2086 # the flag and its value are two words on purpose
    expect_exit 2 python3 "$MOCK_PY" --port 0 $bad
    assert_contains "$bad: names the flag" "$(tail -1 "$T_ERR")" "${bad%% *}"
  done
}

case_existing_faults_and_stats_keep_working() {
  start_mock --rate-429 0.5 --seed 3 --faults-max-per-prompt 1
  local i
  for i in 1 2 3 4 5 6 7 8; do post "$CHAT" "$(chat_body "prompt $i")"; done
  local s
  s=$(curl -s "$MOCK/stats")
  assert_eq "requests by path" "$(jq -c '.requests["/v1/chat/completions"]' <<<"$s")" 8
  assert_eq "200 + 429 = 8" "$(jq '.answers["/v1/chat/completions"] | (."200" // 0) + (."429" // 0)' <<<"$s")" 8
  (($(jq '.answers["/v1/chat/completions"]."429" // 0' <<<"$s") > 0)) || fail "no injected 429 at rate 0.5"
  # Reproducible: the same seed gives the same answers.
  local first
  first=$(jq -c '.answers' <<<"$s")
  t_kill "$MOCK_PID"
  start_mock --rate-429 0.5 --seed 3 --faults-max-per-prompt 1
  for i in 1 2 3 4 5 6 7 8; do post "$CHAT" "$(chat_body "prompt $i")"; done
  assert_eq "same seed, same faults" "$(curl -s "$MOCK/stats" | jq -c .answers)" "$first"
}

# ------------------------------------------------------------------ provider batches
FILES=/v1/files
BATCHES=/v1/batches
MBATCHES=/v1/messages/batches

# get PATH: like post, a GET.
get() {
  curl -s -m 30 -D "$T_TMP/headers.raw" -o "$T_TMP/body" -w '%{http_code}' "$MOCK$1" >"$T_TMP/status" ||
    fail "curl GET $1 failed"
  tr -d '\r' <"$T_TMP/headers.raw" | awk -F': ' 'NR > 1 && NF >= 2 { print tolower($1) ": " substr($0, length($1) + 3) }' >"$T_TMP/headers"
}

# chat_lines PREFIX N [MODEL]: N batch input lines, custom ids PREFIX-1..N, prompts that
# mention "grade" (so the answers differ line by line).
chat_lines() {
  local i
  for ((i = 1; i <= $2; i++)); do
    jq -cn --arg id "$1-$i" --arg c "grade answer $i of $1" --arg m "${3:-m}" \
      '{custom_id: $id, method: "POST", url: "/v1/chat/completions", body: {model: $m, messages: [{role: "user", content: $c}]}}'
  done
}

# upload FILE: POST /v1/files, multipart as curl -F sends it (status and body as post).
upload() {
  curl -s -m 30 -F purpose=batch -F "file=@$1;filename=input.jsonl" -o "$T_TMP/body" \
    -w '%{http_code}' "$MOCK$FILES" >"$T_TMP/status" || fail "curl upload failed"
}

# openai_batch FILE: uploads FILE and creates a batch of it; sets BID to its id.
openai_batch() {
  upload "$1"
  assert_eq "upload of $1" "$(status)" 200
  local fid
  fid=$(jq -r .id "$T_TMP/body")
  post "$BATCHES" "$(jq -cn --arg f "$fid" '{input_file_id: $f, endpoint: "/v1/chat/completions", completion_window: "24h"}')"
  assert_eq "batch of $1" "$(status)" 200
  BID=$(jq -r .id "$T_TMP/body")
}

# batch_is PATH STATUS_KEY WANT: the batch at PATH has .STATUS_KEY == WANT (for wait_for);
# the statuses seen on the way are appended to $T_TMP/seen.
batch_is() {
  local got
  got=$(curl -s -m 10 "$MOCK$1" | jq -r ".$2") || return 1
  echo "$got" >>"$T_TMP/seen"
  [[ $got == "$3" ]]
}

# content ID: a file's bytes.
content() { curl -s -m 30 "$MOCK$FILES/$1/content"; }

case_an_openai_batch_completes_after_its_delay_with_one_answer_per_line_equal_to_the_sync_answer() {
  start_mock --batch-delay-s 3
  assert_eq "the other knobs' defaults" "$(stats -c '.batches.settings | [.batch_fail_rate, .batch_expire, .batch_expire_done]')" '[0,false,0.5]'
  chat_lines t 5 >"$T_TMP/in.jsonl"
  upload "$T_TMP/in.jsonl"
  assert_eq "the file object" "$(body '[.object, .purpose, .bytes, .filename, (.id | test("^file-[0-9a-f]+$"))]')" \
    "[\"file\",\"batch\",$(wc -c <"$T_TMP/in.jsonl"),\"input.jsonl\",true]"
  (($(body .created_at) >= $(date +%s) - 60)) || fail "created_at is a unix time: $(body .created_at)"
  local fid bid t0
  fid=$(jq -r .id "$T_TMP/body")
  get "$FILES/$fid/content"
  assert_eq "the upload reads back" "$(cat "$T_TMP/body")" "$(cat "$T_TMP/in.jsonl")"
  t0=$EPOCHREALTIME
  post "$BATCHES" "$(jq -cn --arg f "$fid" '{input_file_id: $f, endpoint: "/v1/chat/completions", completion_window: "24h", metadata: {night: "7"}}')"
  assert_eq "created" "$(status)" 200
  assert_eq "the batch object" "$(body '[(.id | test("^batch_[0-9a-f]+$")), .object, .endpoint, .input_file_id, .completion_window, .status, .output_file_id, .error_file_id, .request_counts, .metadata, .errors, .completed_at]')" \
    "[true,\"batch\",\"/v1/chat/completions\",\"$fid\",\"24h\",\"validating\",null,null,{\"total\":5,\"completed\":0,\"failed\":0},{\"night\":\"7\"},null,null]"
  assert_eq "expires a day after its creation" "$(body '.expires_at - .created_at')" 86400
  bid=$(body -r .id)
  wait_for "the batch to complete" 60 batch_is "$BATCHES/$bid" status completed
  python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) - float(sys.argv[1]) >= 2.9 else 1)" "$t0" "$EPOCHREALTIME" ||
    fail "completed before its 3 s delay"
  # The statuses seen move forward only, in the providers' order.
  python3 - "$T_TMP/seen" <<'PY' || fail "statuses out of order: $(tr '\n' ' ' <"$T_TMP/seen")"
import sys
order = ["validating", "in_progress", "finalizing", "completed"]
seen = [order.index(l.strip()) for l in open(sys.argv[1])]
sys.exit(0 if seen == sorted(seen) else 1)
PY
  get "$BATCHES/$bid"
  assert_eq "counts" "$(body -c .request_counts)" '{"total":5,"completed":5,"failed":0}'
  assert_eq "no error file" "$(body .error_file_id)" null
  assert_eq "times in order" "$(body '.created_at <= .in_progress_at and .in_progress_at <= .finalizing_at and .finalizing_at <= .completed_at')" true
  local out
  out=$(body -r .output_file_id)
  get "$FILES/$out"
  assert_eq "the output file's object" "$(body -c '[.purpose, .object]')" '["batch_output","file"]'
  content "$out" >"$T_TMP/out.jsonl"
  assert_eq "one line per request, in order" "$(jq -r .custom_id "$T_TMP/out.jsonl" | tr '\n' ' ')" "t-1 t-2 t-3 t-4 t-5 "
  assert_eq "line shape" "$(jq -c '[(.id | test("^batch_req_[0-9a-f]+$")), .response.status_code, (.response.request_id | test("^req_")), .error]' "$T_TMP/out.jsonl" | sort -u)" '[true,200,true,null]'
  local i line want tok=0
  for ((i = 1; i <= 5; i++)); do
    line=$(sed -n "${i}p" "$T_TMP/in.jsonl")
    post "$CHAT" "$(jq -c .body <<<"$line")"
    want=$(jq -cS . "$T_TMP/body")
    assert_eq "line $i is the sync answer" "$(sed -n "${i}p" "$T_TMP/out.jsonl" | jq -cS .response.body)" "$want"
    tok=$((tok + $(jq .usage.total_tokens <<<"$want")))
  done
  assert_eq "batch figures" "$(stats '.batches | [.created, .completed, .items, .items_succeeded, .items_failed, .live]')" "[1,1,5,5,0,0]"
  assert_eq "by provider" "$(stats '.batches.by_provider.openai | [.created, .items_succeeded, .tokens.total]')" "[1,5,$tok]"
  assert_eq "batch tokens apart from the sync ones" "$(stats '[.batches.tokens.total, .tokens.total]')" "[$tok,$tok]"
  assert_eq "counted by path template" "$(stats '.requests | [.["/v1/files"], .["/v1/batches"], (.["/v1/batches/{id}"] > 1), .["/v1/files/{id}/content"]]')" "[1,1,true,2]"
}

# failed_ids FILE: the custom ids of the error file's 500 lines, sorted, one line.
failed_ids() { jq -r 'select(.response.status_code == 500) | .custom_id' "$1" | sort | tr '\n' ' '; }

case_a_fail_rate_of_half_fails_about_half_the_same_ones_every_run() {
  chat_lines f 40 >"$T_TMP/in.jsonl"
  local run bid ids=() nfail
  for run in 1 2 3; do
    start_mock --batch-delay-s 0.5 --batch-fail-rate 0.5 --seed $((run == 3 ? 8 : 7))
    openai_batch "$T_TMP/in.jsonl"
    bid=$BID
    wait_for "run $run to complete" 60 batch_is "$BATCHES/$bid" status completed
    get "$BATCHES/$bid"
    nfail=$(body .request_counts.failed)
    ((nfail >= 10 && nfail <= 30)) || fail "run $run: $nfail of 40 failed at a rate of 0.5"
    content "$(body -r .error_file_id)" >"$T_TMP/err$run.jsonl"
    assert_eq "run $run: one error line per failure" "$(wc -l <"$T_TMP/err$run.jsonl")" "$nfail"
    assert_eq "run $run: the error line shape" "$(jq -c '[.response.status_code, .response.body.error.type, (.response.body.error.message | length > 0), .error]' "$T_TMP/err$run.jsonl" | sort -u)" '[500,"server_error",true,null]'
    assert_eq "run $run: output and errors partition the requests" \
      "$( (content "$(body -r .output_file_id)" | jq -r .custom_id; jq -r .custom_id "$T_TMP/err$run.jsonl") | sort | tr '\n' ' ')" \
      "$(jq -r .custom_id "$T_TMP/in.jsonl" | sort | tr '\n' ' ')"
    assert_eq "run $run: /stats agrees" "$(stats '.batches | [.items_succeeded, .items_failed]')" "[$((40 - nfail)),$nfail]"
    ids+=("$(failed_ids "$T_TMP/err$run.jsonl")")
    if ((run == 1)); then
      # The failed ones sent again in a new batch of the same run draw again: a retry can succeed.
      jq -c 'select(.response.status_code == 500) | .custom_id' "$T_TMP/err1.jsonl" >"$T_TMP/failed1"
      grep -F -f "$T_TMP/failed1" "$T_TMP/in.jsonl" >"$T_TMP/retry.jsonl"
      openai_batch "$T_TMP/retry.jsonl"
      bid=$BID
      wait_for "the retry to complete" 60 batch_is "$BATCHES/$bid" status completed
      get "$BATCHES/$bid"
      (($(body .request_counts.completed) > 0)) || fail "no retried item succeeded: $(body -c .request_counts)"
    fi
    t_kill "$MOCK_PID"
  done
  assert_eq "the same seed fails the same ones" "${ids[1]}" "${ids[0]}"
  [[ ${ids[2]} != "${ids[0]}" ]] || fail "another seed failed the very same ones"
}

case_an_expired_batch_splits_done_and_expired_in_both_shapes() {
  start_mock --batch-delay-s 1 --batch-expire --batch-expire-done 0.3
  chat_lines e 10 >"$T_TMP/in.jsonl"
  local bid
  openai_batch "$T_TMP/in.jsonl"
  bid=$BID
  wait_for "the batch to expire" 60 batch_is "$BATCHES/$bid" status expired
  get "$BATCHES/$bid"
  assert_eq "expired, not completed" "$(body -c '[.completed_at, (.expired_at > 0), .request_counts]')" '[null,true,{"total":10,"completed":3,"failed":7}]'
  assert_eq "the first 30 % were done" "$(content "$(body -r .output_file_id)" | jq -r .custom_id | tr '\n' ' ')" "e-1 e-2 e-3 "
  content "$(body -r .error_file_id)" >"$T_TMP/err.jsonl"
  assert_eq "the rest expired" "$(jq -r .custom_id "$T_TMP/err.jsonl" | tr '\n' ' ')" "e-4 e-5 e-6 e-7 e-8 e-9 e-10 "
  assert_eq "expired lines" "$(jq -c '[.response, .error.code, (.error.message | length > 0)]' "$T_TMP/err.jsonl" | sort -u)" '[null,"batch_expired",true]'
  # Anthropic: the same split, as result types.
  post "$MBATCHES" "$(jq -cn '{requests: [range(1; 11) | {custom_id: "a\(.)", params: {max_tokens: 9, messages: [{role: "user", content: "grade \(.)"}]}}]}')"
  bid=$(body -r .id)
  wait_for "the message batch to end" 60 batch_is "$MBATCHES/$bid" processing_status ended
  get "$MBATCHES/$bid"
  assert_eq "anthropic counts" "$(body -c .request_counts)" '{"processing":0,"succeeded":3,"errored":0,"canceled":0,"expired":7}'
  get "$MBATCHES/$bid/results"
  assert_eq "result types" "$(jq -r .result.type "$T_TMP/body" | uniq -c | awk '{ print $1 $2 }' | tr '\n' ' ')" "3succeeded 7expired "
  assert_eq "expired results carry nothing else" "$(jq -c 'select(.result.type == "expired") | .result' "$T_TMP/body" | sort -u)" '{"type":"expired"}'
  assert_eq "/stats" "$(stats '.batches | [.expired, .items_expired, .items_succeeded, .by_provider.anthropic.items_expired]')" "[2,14,6,7]"
}

case_a_cancelled_batch_ends_cancelled_with_its_unfinished_items_in_both_shapes() {
  # 600 s: nothing is done for the first 60 s, so the cancel finds every item unfinished.
  start_mock --batch-delay-s 600
  chat_lines c 4 >"$T_TMP/in.jsonl"
  local bid
  openai_batch "$T_TMP/in.jsonl"
  bid=$BID
  post "$BATCHES/$bid/cancel" ""
  assert_eq "cancel answers" "$(status)" 200
  assert_eq "cancelling first" "$(body -c '[.status, (.cancelling_at > 0), .cancelled_at]')" '["cancelling",true,null]'
  wait_for "the batch to be cancelled" 30 batch_is "$BATCHES/$bid" status cancelled
  get "$BATCHES/$bid"
  assert_eq "no output, an error file" "$(body -c '[.output_file_id, (.error_file_id | type), (.cancelled_at > 0), .request_counts]')" '[null,"string",true,{"total":4,"completed":0,"failed":4}]'
  assert_eq "every item cancelled" "$(content "$(body -r .error_file_id)" | jq -c '[.custom_id, .response, .error.code]' | tr '\n' ' ')" \
    '["c-1",null,"batch_cancelled"] ["c-2",null,"batch_cancelled"] ["c-3",null,"batch_cancelled"] ["c-4",null,"batch_cancelled"] '
  post "$BATCHES/$bid/cancel" ""
  assert_eq "an ended batch cannot be cancelled" "$(status)" 409
  assert_contains "says why" "$(body -r .error.message)" "has ended"
  post "$BATCHES/batch_nope/cancel" ""
  assert_eq "an unknown batch" "$(status)" 404
  # Cancelled part-way: what was done keeps its answers (a prefix, in order), the rest is
  # cancelled. 30 s: an item is done every 2.4 s, the last at 27 s, far from the cancel.
  control '{"batch_delay_s":30}'
  chat_lines h 10 >"$T_TMP/half.jsonl"
  openai_batch "$T_TMP/half.jsonl"
  bid=$BID
  # shellcheck disable=SC2016 # eval expands it, each try
  wait_for "an item to be done" 60 eval '[[ $(curl -s -m 10 "$MOCK$BATCHES/$bid" | jq .request_counts.completed) -ge 1 ]]'
  local done_before
  done_before=$(curl -s -m 10 "$MOCK$BATCHES/$bid" | jq .request_counts.completed)
  post "$BATCHES/$bid/cancel" ""
  assert_eq "cancelled part-way" "$(body -r .status)" cancelling
  wait_for "it to be cancelled" 30 batch_is "$BATCHES/$bid" status cancelled
  get "$BATCHES/$bid"
  local kept
  kept=$(body .request_counts.completed)
  ((kept >= done_before && kept < 10)) || fail "kept $kept answers, $done_before were done before the cancel"
  assert_eq "the answers are the first ones" "$(content "$(body -r .output_file_id)" | jq -r .custom_id | tr '\n' ' ')" \
    "$(jq -r .custom_id "$T_TMP/half.jsonl" | head -"$kept" | tr '\n' ' ')"
  assert_eq "the rest cancelled" "$(content "$(body -r .error_file_id)" | jq -r '"\(.custom_id) \(.error.code)"' | tr '\n' ' ')" \
    "$(jq -r .custom_id "$T_TMP/half.jsonl" | tail -n +"$((kept + 1))" | sed 's/$/ batch_cancelled/' | tr '\n' ' ')"
  # Anthropic.
  post "$MBATCHES" '{"requests":[{"custom_id":"k1","params":{"messages":[{"role":"user","content":"x"}]}},{"custom_id":"k2","params":{"messages":[{"role":"user","content":"y"}]}}]}'
  bid=$(body -r .id)
  get "$MBATCHES/$bid/results"
  assert_eq "no results before the end" "$(status)" 409
  assert_eq "Anthropic's error shape" "$(body -r .type)" error
  post "$MBATCHES/$bid/cancel" ""
  assert_eq "canceling first" "$(body -c '[.processing_status, (.cancel_initiated_at | type), .results_url]')" '["canceling","string",null]'
  wait_for "the message batch to end" 30 batch_is "$MBATCHES/$bid" processing_status ended
  get "$MBATCHES/$bid"
  assert_eq "canceled counts" "$(body -c .request_counts)" '{"processing":0,"succeeded":0,"errored":0,"canceled":2,"expired":0}'
  get "$MBATCHES/$bid/results"
  assert_eq "canceled results" "$(jq -c . "$T_TMP/body" | tr '\n' ' ')" '{"custom_id":"k1","result":{"type":"canceled"}} {"custom_id":"k2","result":{"type":"canceled"}} '
  post "$MBATCHES/$bid/cancel" ""
  assert_eq "an ended message batch cannot be cancelled" "$(status)" 409
  assert_eq "/stats" "$(stats '.batches | [.cancelled, .items_cancelled, .by_provider.openai.cancelled]')" "[3,$((6 + 10 - kept)),2]"
}

case_an_anthropic_batch_ends_after_its_delay_with_the_sync_messages_as_results() {
  start_mock --batch-delay-s 2
  local reqs bid
  reqs=$(jq -cn '[
    {custom_id: "ok_1", params: {model: "claude-x", max_tokens: 50, messages: [{role: "user", content: "grade this answer"}]}},
    {custom_id: "ok-2", params: {system: "be brief", messages: [{role: "user", content: [{type: "text", text: "summarize: one two three"}]}]}},
    {custom_id: "boom", params: {messages: [{role: "user", content: "please [mock:500]"}]}},
    {custom_id: "bad", params: {messages: [{role: "user", content: 5}]}}]')
  post "$MBATCHES" "{\"requests\":$reqs}"
  assert_eq "created" "$(status)" 200
  assert_eq "the batch object" "$(body -c '[(.id | test("^msgbatch_[0-9a-f]+$")), .type, .processing_status, .request_counts, .ended_at, .cancel_initiated_at, .results_url]')" \
    '[true,"message_batch","in_progress",{"processing":4,"succeeded":0,"errored":0,"canceled":0,"expired":0},null,null,null]'
  [[ $(body -r .created_at) =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\.[0-9]{6}Z$ ]] || fail "created_at in RFC 3339: $(body .created_at)"
  bid=$(body -r .id)
  wait_for "the message batch to end" 60 batch_is "$MBATCHES/$bid" processing_status ended
  get "$MBATCHES/$bid"
  assert_eq "counts" "$(body -c .request_counts)" '{"processing":0,"succeeded":2,"errored":2,"canceled":0,"expired":0}'
  assert_eq "results_url on this port" "$(body -r .results_url)" "$MOCK$MBATCHES/$bid/results"
  [[ $(body -r .ended_at) > $(body -r .created_at) ]] || fail "ended_at after created_at: $(body -c '[.created_at, .ended_at]')"
  curl -s -m 30 "$(body -r .results_url)" >"$T_TMP/results.jsonl"
  assert_eq "one result per request, in order" "$(jq -r .custom_id "$T_TMP/results.jsonl" | tr '\n' ' ')" "ok_1 ok-2 boom bad "
  local i
  for i in 0 1; do
    post "$MSGS" "$(jq -c ".[$i].params" <<<"$reqs")"
    assert_eq "result $i is the sync message" "$(sed -n "$((i + 1))p" "$T_TMP/results.jsonl" | jq -cS .result.message)" "$(jq -cS '.' "$T_TMP/body")"
  done
  assert_eq "a failed item is errored, api_error" "$(sed -n 3p "$T_TMP/results.jsonl" | jq -c '[.result.type, .result.error.type, .result.error.error.type]')" '["errored","error","api_error"]'
  assert_eq "an invalid item is errored, invalid_request_error" "$(sed -n 4p "$T_TMP/results.jsonl" | jq -c '[.result.type, .result.error.error.type]')" '["errored","invalid_request_error"]'
  get "$MBATCHES"
  assert_eq "the list holds it" "$(body -c '[.data[0].id, .has_more]')" "[\"$bid\",false]"
  get "$MBATCHES/$bid/nope"
  assert_eq "an unknown path" "$(status)" 404
  get "$MBATCHES/msgbatch_nope"
  assert_eq "an unknown batch" "$(body -c '[.type, .error.type]')" '["error","not_found_error"]'
  get "$BATCHES/$bid"
  assert_eq "a message batch is not an OpenAI batch" "$(status)" 404
}

case_a_file_mixing_models_fails_its_batch_at_validation() {
  start_mock --batch-delay-s 1
  { chat_lines m 2 model-a; chat_lines n 1 model-b; } >"$T_TMP/in.jsonl"
  local bid
  openai_batch "$T_TMP/in.jsonl"
  bid=$BID
  wait_for "the batch to fail" 30 batch_is "$BATCHES/$bid" status failed
  get "$BATCHES/$bid"
  assert_eq "failed at validation" "$(body -c '[.errors.data[0].code, .errors.data[0].line, .output_file_id, .error_file_id, (.failed_at > 0), .in_progress_at, .request_counts.completed]')" '["mismatched_model",3,null,null,true,null,0]'
  assert_eq "/stats" "$(stats '.batches | [.failed, .items_succeeded, .items_failed]')" "[1,0,0]"
}

case_batch_endpoints_pass_the_limits_outages_and_faults_of_the_sync_ones() {
  start_mock --batch-delay-s 0.5 --rpm 1 --rate-500 1 --outage 0+600
  post "$CHAT" "$(chat_body x)"
  assert_eq "the sync endpoint is down" "$(status)" 429
  chat_lines p 3 >"$T_TMP/in.jsonl"
  local bid
  openai_batch "$T_TMP/in.jsonl"
  bid=$BID
  wait_for "the batch to complete" 30 batch_is "$BATCHES/$bid" status completed
  get "$BATCHES/$bid"
  assert_eq "every item answered" "$(body -c .request_counts)" '{"total":3,"completed":3,"failed":0}'
  assert_eq "no rate-limit headers on batch answers" "$(grep -c ratelimit "$T_TMP/headers" || true)" 0
  post "$MBATCHES" '{"requests":[{"custom_id":"q","params":{"messages":[{"role":"user","content":"q"}]}}]}'
  assert_eq "message batches too" "$(status)" 200
  assert_eq "batch requests are not admitted or refused" "$(stats '[.admitted, .outage_refused]')" "[0,1]"
}

case_bad_uploads_and_batch_requests_get_400_and_change_nothing() {
  start_mock --batch-delay-s 0.5
  chat_lines g 2 >"$T_TMP/good.jsonl"
  local good_line bad i=0
  good_line=$(head -1 "$T_TMP/good.jsonl")
  # Bad lines, each in an otherwise good file.
  local -a lines=(
    'not json' '[1,2]' '"text"'
    "$(jq -c 'del(.custom_id)' <<<"$good_line")" "$(jq -c '.custom_id = ""' <<<"$good_line")"
    "$(jq -c '.custom_id = 7' <<<"$good_line")" "$good_line"
    "$(jq -c '.custom_id = "z" | .method = "GET"' <<<"$good_line")"
    "$(jq -c '.custom_id = "z" | del(.method)' <<<"$good_line")"
    "$(jq -c '.custom_id = "z" | .url = "/v1/embeddings"' <<<"$good_line")"
    "$(jq -c '.custom_id = "z" | .body = "x"' <<<"$good_line")"
    "$(jq -c '.custom_id = "z" | del(.body)' <<<"$good_line")")
  for bad in "${lines[@]}"; do
    i=$((i + 1))
    { cat "$T_TMP/good.jsonl"; printf '%s\n' "$bad"; } >"$T_TMP/bad$i.jsonl"
    upload "$T_TMP/bad$i.jsonl"
    assert_eq "400 for the line $bad" "$(status)" 400
    assert_eq "OpenAI's error shape for $bad" "$(body -c '[.error.type, (.error.message | test("line 3"))]')" '["invalid_request_error",true]'
  done
  printf '\xff\xfe\n' >"$T_TMP/latin.jsonl"
  : >"$T_TMP/empty.jsonl"
  printf '\n\n' >"$T_TMP/blank.jsonl"
  for bad in latin empty blank; do
    upload "$T_TMP/$bad.jsonl"
    assert_eq "400 for the $bad file" "$(status)" 400
  done
  # Bad multipart bodies.
  local b=XyZ
  local -a parts=(
    "multipart/form-data; boundary=$b|--$b"$'\r\n''Content-Disposition: form-data; name="purpose"'$'\r\n\r\n''batch'$'\r\n'"--$b"$'\r\n''Content-Disposition: form-data; name="file"; filename="f"'$'\r\n\r\n'"$good_line"$'\r\n'"--$b"
    "multipart/form-data|--$b"$'\r\n\r\n'"--$b--"
    "application/json|{\"purpose\":\"batch\"}"
    "multipart/form-data; boundary=$b|garbage"
    "multipart/form-data; boundary=$b|--$b"$'\r\n''Content-Disposition: form-data; name="purpose"'$'\r\n''batch'$'\r\n'"--$b--"
    "multipart/form-data; boundary=$b|--$b"$'\r\n''Content-Disposition: attachment; name="purpose"'$'\r\n\r\n''batch'$'\r\n'"--$b--"
    "multipart/form-data; boundary=$b|--$b"$'\r\n''Content-Disposition: form-data; name="purpose"'$'\r\n\r\n''batch'$'\r\n'"--$b"$'\r\n''Content-Disposition: form-data; name="purpose"'$'\r\n\r\n''batch'$'\r\n'"--$b--")
  local p ctype
  for p in "${parts[@]}"; do
    ctype=${p%%|*}
    curl -s -m 30 -H "Content-Type: $ctype" --data-binary "${p#*|}" -o "$T_TMP/body" -w '%{http_code}' "$MOCK$FILES" >"$T_TMP/status"
    assert_eq "400 for the multipart body $(printf %q "${p:0:80}")" "$(status)" 400
    assert_contains "says it is the multipart" "$(body -r .error.message)" "multipart"
  done
  curl -s -m 30 -F purpose=fine-tune -F "file=@$T_TMP/good.jsonl" -o "$T_TMP/body" -w '%{http_code}' "$MOCK$FILES" >"$T_TMP/status"
  assert_eq "a purpose other than batch" "$(status)" 400
  curl -s -m 30 -F purpose=batch -F "data=@$T_TMP/good.jsonl" -o "$T_TMP/body" -w '%{http_code}' "$MOCK$FILES" >"$T_TMP/status"
  assert_eq "no file field" "$(status)" 400
  # Bad batch requests (the file is good).
  upload "$T_TMP/good.jsonl"
  local fid
  fid=$(body -r .id)
  local -a reqs=(
    '[1]' '{}' "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/embeddings\",\"completion_window\":\"24h\"}"
    "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"1h\"}"
    "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/chat/completions\"}"
    '{"input_file_id":"file-nope","endpoint":"/v1/chat/completions","completion_window":"24h"}'
    '{"input_file_id":7,"endpoint":"/v1/chat/completions","completion_window":"24h"}'
    "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\",\"metadata\":{\"a\":1}}"
    "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\",\"metadata\":$(jq -cn '[range(17) | {key: "k\(.)", value: "v"}] | from_entries')}"
    "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\",\"priority\":1}"
    'not json')
  for bad in "${reqs[@]}"; do
    post "$BATCHES" "$bad"
    assert_eq "400 for the batch request ${bad:0:120}" "$(status)" 400
    assert_eq "OpenAI's error shape" "$(body -r .error.type)" invalid_request_error
  done
  # Bad message batches.
  local ok='{"custom_id":"a","params":{"messages":[{"role":"user","content":"x"}]}}'
  local -a mreqs=('{}' '{"requests":[]}' '{"requests":{}}' "{\"requests\":[$ok],\"extra\":1}"
    "{\"requests\":[$ok,$ok]}" '{"requests":[{"custom_id":"a b","params":{}}]}'
    '{"requests":[{"custom_id":"ü","params":{}}]}' '{"requests":[{"custom_id":"","params":{}}]}'
    "{\"requests\":[{\"custom_id\":\"$(printf 'x%.0s' {1..65})\",\"params\":{}}]}"
    '{"requests":[{"custom_id":"a","params":[]}]}' '{"requests":[{"custom_id":"a"}]}'
    '{"requests":[{"custom_id":"a","params":{},"x":1}]}' '{"requests":[7]}' '[]')
  for bad in "${mreqs[@]}"; do
    post "$MBATCHES" "$bad"
    assert_eq "400 for the message batch ${bad:0:120}" "$(status)" 400
    assert_eq "Anthropic's error shape" "$(body -c '[.type, .error.type]')" '["error","invalid_request_error"]'
  done
  get "$FILES/file-nope/content"
  assert_eq "an unknown file" "$(status)" 404
  get "$BATCHES/batch_nope"
  assert_eq "an unknown batch" "$(status)" 404
  assert_eq "no batch was made, one file was kept" "$(stats '.batches | [.created, .items, .files]')" "[0,0,1]"
  assert_eq "the 400s were counted" "$(stats '[.answers["/v1/files"]["400"], .answers["/v1/batches"]["400"], .answers["/v1/messages/batches"]["400"]]')" \
    "[$((${#lines[@]} + 3 + ${#parts[@]} + 2)),${#reqs[@]},${#mreqs[@]}]"
}

case_control_sets_the_batch_knobs_for_new_batches_only() {
  start_mock --batch-delay-s 600
  chat_lines k 4 >"$T_TMP/in.jsonl"
  local slow pre fast expired bad before
  openai_batch "$T_TMP/in.jsonl"
  slow=$BID
  # One made before the expiry is switched on below: it must still complete.
  control '{"batch_delay_s":8}'
  openai_batch "$T_TMP/in.jsonl"
  pre=$BID
  control '{"batch_delay_s":0.5,"batch_fail_rate":1}'
  assert_eq "control answers the settings" "$(body -c '.batches.settings | [.batch_delay_s, .batch_fail_rate]')" '[0.5,1]'
  openai_batch "$T_TMP/in.jsonl"
  fast=$BID
  wait_for "the new batch to complete" 30 batch_is "$BATCHES/$fast" status completed
  get "$BATCHES/$fast"
  assert_eq "every item failed at rate 1" "$(body -c .request_counts)" '{"total":4,"completed":0,"failed":4}'
  get "$BATCHES/$slow"
  [[ $(body -r .status) =~ ^(validating|in_progress)$ ]] || fail "the old batch kept its 600 s: $(body -r .status)"
  control '{"batch_fail_rate":0,"batch_expire":true,"batch_expire_done":0.5}'
  openai_batch "$T_TMP/in.jsonl"
  expired=$BID
  wait_for "the batch to expire" 30 batch_is "$BATCHES/$expired" status expired
  get "$BATCHES/$expired"
  assert_eq "half done, half expired" "$(body -c .request_counts)" '{"total":4,"completed":2,"failed":2}'
  wait_for "the batch made before to end" 60 batch_is "$BATCHES/$pre" status completed
  get "$BATCHES/$pre"
  assert_eq "it kept its own settings" "$(body -c .request_counts)" '{"total":4,"completed":4,"failed":0}'
  control '{"batch_expire":false,"batch_delay_s":0}'
  post "$MBATCHES" '{"requests":[{"custom_id":"now","params":{"messages":[{"role":"user","content":"x"}]}}]}'
  get "$MBATCHES/$(body -r .id)"
  assert_eq "a delay of 0 ends at once" "$(body -c '[.processing_status, .request_counts.succeeded]')" '["ended",1]'
  before=$(stats -c .batches.settings)
  for bad in '{"batch_delay_s":-1}' '{"batch_delay_s":"1"}' '{"batch_delay_s":1e999}' '{"batch_delay_s":null}' \
             '{"batch_fail_rate":1.5}' '{"batch_fail_rate":-0.1}' '{"batch_fail_rate":true}' \
             '{"batch_expire":1}' '{"batch_expire":"yes"}' '{"batch_expire_done":2}' \
             '{"batch_refuse":-1}' '{"batch_refuse":1.5}' '{"batch_refuse_status":404}' \
             '{"batch_refuse_status":true}' '{"batch_shuffle":1}' '{"batch_delay_s":1,"batch_delay":1}'; do
    control "$bad"
    assert_eq "400 for $bad" "$(status)" 400
    [[ -n $(body .error.message) ]] || fail "no message for $bad"
  done
  assert_eq "nothing changed" "$(stats -c .batches.settings)" "$before"
}

case_three_clients_making_batches_at_once_get_distinct_ids_and_every_item() {
  start_mock --batch-delay-s 1
  local c pids=()
  for c in 1 2 3; do
    (
      local i bid fid
      for i in 1 2 3 4; do
        chat_lines "c$c-b$i" 5 >"$T_TMP/in$c-$i.jsonl"
        fid=$(curl -s -m 30 -F purpose=batch -F "file=@$T_TMP/in$c-$i.jsonl" "$MOCK$FILES" | jq -r .id)
        bid=$(curl -s -m 30 -d "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}" "$MOCK$BATCHES" | jq -r .id)
        echo "$bid" >>"$T_TMP/ids$c"
      done
    ) &
    pids+=("$!")
  done
  for c in "${pids[@]}"; do wait "$c" || fail "a client failed"; done
  cat "$T_TMP"/ids? >"$T_TMP/ids"
  assert_eq "twelve distinct batch ids" "$(grep -c '^batch_' "$T_TMP/ids")/$(sort -u "$T_TMP/ids" | wc -l)" "12/12"
  # shellcheck disable=SC2016 # eval expands it, each try
  wait_for "every batch to end" 60 eval '[[ $(stats .batches.live) == 0 ]]'
  local bid
  while read -r bid; do
    get "$BATCHES/$bid"
    assert_eq "$bid completed" "$(body -c '[.status, .request_counts.completed]')" '["completed",5]'
  done <"$T_TMP/ids"
  assert_eq "/stats" "$(stats '.batches | [.created, .completed, .items, .items_succeeded]')" "[12,12,60,60]"
}

# raw_request BYTES: sends BYTES (printf escapes) over one connection; prints the status code.
raw_request() {
  python3 - "${MOCK#http://}" "$1" <<'PY'
import socket, sys
host, port = sys.argv[1].split(":")
s = socket.create_connection((host, int(port)), timeout=30)
s.sendall(sys.argv[2].encode().decode("unicode_escape").encode("latin-1"))
s.shutdown(socket.SHUT_WR)
data = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
print(data.split(b" ", 2)[1].decode())
PY
}

case_uploads_sent_chunked_or_after_100_continue_are_taken_and_bad_chunks_refused() {
  start_mock --batch-delay-s 0
  chat_lines u 3 >"$T_TMP/in.jsonl"
  local how fid
  for how in 'Transfer-Encoding: chunked' 'Expect: 100-continue'; do
    curl -s -m 30 -H "$how" -F purpose=batch -F "file=@$T_TMP/in.jsonl" -o "$T_TMP/body" -w '%{http_code}' "$MOCK$FILES" >"$T_TMP/status"
    assert_eq "an upload with $how" "$(status)" 200
    assert_eq "all of it, with $how" "$(body .bytes)" "$(wc -c <"$T_TMP/in.jsonl")"
    fid=$(body -r .id)
    curl -s -m 30 -H "$how" -H 'Content-Type: application/json' --data-binary "{\"input_file_id\":\"$fid\",\"endpoint\":\"/v1/chat/completions\",\"completion_window\":\"24h\"}" \
      -o "$T_TMP/body" -w '%{http_code}' "$MOCK$BATCHES" >"$T_TMP/status"
    assert_eq "a batch created with $how" "$(status)" 200
    get "$BATCHES/$(body -r .id)"
    assert_eq "and answered, with $how" "$(body -c '[.status, .request_counts.completed]')" '["completed",3]'
  done
  local bad
  for bad in 'zz\r\n{}\r\n0\r\n\r\n' '2\r\n{}XX\r\n0\r\n\r\n' '-1\r\n' 'ffffffff\r\n'; do
    assert_eq "a bad chunked body $bad" "$(raw_request "POST $BATCHES HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n$bad")" 400
  done
  assert_eq "a bad Content-Length" "$(raw_request "POST $FILES HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n")" 400
  assert_eq "an empty upload" "$(raw_request "POST $FILES HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")" 400
  assert_eq "still serving" "$(curl -s -m 10 "$MOCK/healthz")" ok
  assert_eq "files kept: two uploads, two outputs" "$(stats .batches.files)" 4
}

case_refused_batch_requests_get_the_providers_errors_change_nothing_and_then_flow() {
  start_mock --batch-delay-s 0 --batch-refuse 1
  chat_lines r 2 >"$T_TMP/in.jsonl"
  upload "$T_TMP/in.jsonl"
  assert_eq "the first is refused by the flag" "$(status)" 500
  assert_eq "OpenAI's server error" "$(body -r .error.type)" server_error
  assert_eq "no file kept" "$(stats .batches.files)" 0
  local st fid bid
  for st in 429 503; do
    control "{\"batch_refuse\":3,\"batch_refuse_status\":$st}"
    assert_eq "control answers it" "$(body -c '.batches.settings | [.batch_refuse, .batch_refuse_status]')" "[3,$st]"
    upload "$T_TMP/in.jsonl"
    assert_eq "upload refused with $st" "$(status)" "$st"
    post "$MBATCHES" '{"requests":[{"custom_id":"a","params":{"messages":[{"role":"user","content":"x"}]}}]}'
    assert_eq "message batch refused with $st" "$(status)" "$st"
    assert_eq "retry-after on $st" "$(header retry-after)" 1
    assert_eq "Anthropic's shape for $st" "$(body -c '[.type, .error.type]')" \
      "[\"error\",\"$([[ $st == 429 ]] && echo rate_limit_error || echo overloaded_error)\"]"
    get "$BATCHES/batch_nope"
    assert_eq "GETs refused too ($st), before the lookup" "$(status)" "$st"
  done
  assert_eq "nothing was made" "$(stats -c '.batches | [.files, .created, .refused]')" "[0,0,7]"
  openai_batch "$T_TMP/in.jsonl"
  bid=$BID
  control '{"batch_refuse":1}'
  post "$BATCHES/$bid/cancel" ""
  assert_eq "a cancel refused (the status set last stays)" "$(status)" 503
  get "$BATCHES/$bid"
  assert_eq "then everything flows, the batch untouched" "$(body -c '[.status, .request_counts.completed]')" '["completed",2]'
  fid=$(body -r .output_file_id)
  control '{"batch_refuse":1,"batch_refuse_status":500}'
  get "$FILES/$fid/content"
  assert_eq "a content download refused" "$(status)" 500
  get "$FILES/$fid/content"
  assert_eq "and the next one served" "$(status)/$(wc -l <"$T_TMP/body")" 200/2
  assert_eq "sync endpoints never refused by it" "$(stats '.answers["/v1/chat/completions"] // {}')" '{}'
}

case_shuffled_results_hold_every_answer_under_its_custom_id_in_another_order() {
  start_mock --batch-delay-s 0 --batch-shuffle --batch-fail-rate 0.3 --seed 4
  chat_lines s 20 >"$T_TMP/in.jsonl"
  openai_batch "$T_TMP/in.jsonl"
  get "$BATCHES/$BID"
  { content "$(body -r .output_file_id)"; content "$(body -r .error_file_id)"; } >"$T_TMP/out.jsonl"
  assert_eq "every custom_id once" "$(jq -r .custom_id "$T_TMP/out.jsonl" | sort | tr '\n' ' ')" "$(jq -r .custom_id "$T_TMP/in.jsonl" | sort | tr '\n' ' ')"
  [[ $(jq -r 'select(.error == null and .response.status_code == 200) | .custom_id' "$T_TMP/out.jsonl" | tr '\n' ' ') != \
     "$(jq -r .custom_id "$T_TMP/in.jsonl" | grep -F -x -f <(jq -r 'select(.response.status_code == 200) | .custom_id' "$T_TMP/out.jsonl") | tr '\n' ' ')" ]] ||
    fail "the output file kept the input order"
  # Each answer is the one for its own request.
  local cid want
  for cid in $(jq -r 'select(.response.status_code == 200) | .custom_id' "$T_TMP/out.jsonl"); do
    post "$CHAT" "$(jq -c --arg c "$cid" 'select(.custom_id == $c) | .body' "$T_TMP/in.jsonl")"
    want=$(jq -cS . "$T_TMP/body")
    assert_eq "$cid has its own answer" "$(jq -cS --arg c "$cid" 'select(.custom_id == $c) | .response.body' "$T_TMP/out.jsonl")" "$want"
  done
  post "$MBATCHES" "$(jq -cn '{requests: [range(1; 21) | {custom_id: "m\(.)", params: {messages: [{role: "user", content: "grade \(.)"}]}}]}')"
  get "$MBATCHES/$(body -r .id)/results"
  [[ $(jq -r .custom_id "$T_TMP/body" | tr '\n' ' ') != "$(seq -f 'm%g' 1 20 | tr '\n' ' ')" ]] || fail "the results kept the request order"
  assert_eq "every result once" "$(jq -r .custom_id "$T_TMP/body" | sort | tr '\n' ' ')" "$(seq -f 'm%g' 1 20 | sort | tr '\n' ' ')"
  control '{"batch_shuffle":false}'
  openai_batch "$T_TMP/in.jsonl"
  get "$BATCHES/$BID"
  assert_eq "in order again once it is off" "$(content "$(body -r .output_file_id)" | jq -r .custom_id | tr '\n' ' ')" \
    "$(jq -r .custom_id "$T_TMP/in.jsonl" | grep -F -x -f <(content "$(body -r .output_file_id)" | jq -r .custom_id) | tr '\n' ' ')"
}

t_run "$@"
