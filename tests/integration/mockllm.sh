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
body() { jq -c "$1" "$T_TMP/body"; }
stats() { curl -s -m 10 "$MOCK/_stats" | jq -c "$1"; }
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
             "--outage-path /v1/nope"; do
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

t_run "$@"
