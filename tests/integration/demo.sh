#!/usr/bin/env bash
# The demo (scripts/demo.sh) from this checkout, short: it must finish, and its report's
# totals must equal a direct SQL count.
source "$(dirname "$0")/../lib.sh"

case_demo_short_variant_report_matches_sql() {
  need_pg
  LEASH_DEMO_TICKETS=150 LEASH_DEMO_SLOTS=4 expect_exit 0 bash "$LEASH_SRC/scripts/demo.sh"
  local out report sql
  out=$(<"$T_OUT")
  report=$(sed -n 's/^tasks *150: \(done [0-9]*, dead [0-9]*\).*/\1/p' <<<"$out" | tail -1)
  sql=$(sed -n 's/^sql *\(done [0-9]*, dead [0-9]*\), pending 0, leased 0$/\1/p' <<<"$out")
  [[ -n $report ]] || fail "no report line in the demo's output"$'\n'"$out"
  assert_eq "report totals vs SQL" "$report" "$sql"
  assert_contains "the batch settled" "$report" "done"
}

# The same, --batch-api: every ticket graded through the mock's provider batches (no
# synchronous call), and the report shows the batch cost beside the synchronous one.
case_demo_batch_api_variant_grades_through_provider_batches() {
  need_pg
  LEASH_DEMO_TICKETS=150 LEASH_DEMO_SLOTS=4 expect_exit 0 bash "$LEASH_SRC/scripts/demo.sh" --batch-api
  local out report sql
  out=$(<"$T_OUT")
  report=$(sed -n 's/^tasks *150: \(done [0-9]*, dead [0-9]*\).*/\1/p' <<<"$out" | tail -1)
  sql=$(sed -n 's/^sql *\(done [0-9]*, dead [0-9]*\), pending 0, leased 0$/\1/p' <<<"$out")
  assert_eq "report totals vs SQL" "$report" "$sql"
  assert_eq "report totals" "$report" "done 150, dead 0"
  assert_contains "the batch cost line" "$out" "llm-batch:openai/mock-grader: 150 calls"
  assert_contains "the batch cost line" "$out" "at batch prices ("
}

t_run "$@"
