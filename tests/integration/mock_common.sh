# Sourced by the integration areas that talk to the mock LLM (scripts/mock_llm.py) over
# loopback. Needs tests/lib.sh (t_on_exit, t_kill, wait_for, T_TMP, LEASH_SRC).

# start_mock [MOCK OPTIONS...]: the mock on a free port, killed at exit; sets MOCK (its
# base URL). It exits by itself after 120 s without a request, so a lost test leaves no server.
start_mock() {
  python3 "$LEASH_SRC/scripts/mock_llm.py" --port 0 --idle-exit 120 "$@" \
    >"$T_TMP/mock.out" 2>"$T_TMP/mock.log" &
  t_on_exit t_kill "$!"
  wait_for "the mock LLM to print its port" 10 grep -q '^PORT [0-9]' "$T_TMP/mock.out"
  MOCK=http://127.0.0.1:$(sed -n '1s/^PORT //p' "$T_TMP/mock.out")
}

# mock_stat KEY...: a number from the mock's /stats (0 when absent), e.g.
# mock_stat answers /v1/chat/completions 200
mock_stat() {
  python3 - "$MOCK/stats" "$@" <<'PY'
import json, sys, urllib.request
d = json.load(urllib.request.urlopen(sys.argv[1], timeout=10))
for k in sys.argv[2:]:
    d = d.get(k, 0) if isinstance(d, dict) else 0
print(d)
PY
}
