#!/usr/bin/env bash
# THE test command (README and .ci/run call it): installs what is missing, builds,
# starts a throwaway PostgreSQL and runs every test stage, then prints one summary.
#
#   stages: ctest (build/)             unit + integration tests
#           ctest asan (build-asan/)   the same under AddressSanitizer + UBSan
#           ctest tsan (build-tsan/)   tests labelled "concurrent" under ThreadSanitizer
#           busted (tests/lua)         Lua specs, if any
#           valgrind (build/)          tests labelled "valgrind", if any
#           fuzz (build-fuzz/)         libFuzzer targets, a short run each (clang only)
#
# Environment: LEASH_TEST_QUICK=1 skips the sanitizer and fuzz trees (for developers);
# LEASH_TEST_JOBS (default 2) sets build and ctest parallelism.
# A failing stage does not stop the others; the exit status is non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${LEASH_TEST_JOBS:-2}
QUICK=${LEASH_TEST_QUICK:-0}
[[ $QUICK == 1 ]] || QUICK=0

say() { printf '\n==> %s\n' "$*"; }

# ------------------------------------------------------------------ packages
# shellcheck source=scripts/deps.sh
source scripts/deps.sh
deps_install

# Tests see only the server this script starts: no stray connection settings.
mapfile -t pg_vars < <(compgen -e | grep '^PG' || true)
unset DATABASE_URL "${pg_vars[@]}"

# ------------------------------------------------------------------ stage bookkeeping
STAGE_NAMES=() STAGE_RESULTS=() STAGE_NOTES=()
record() { STAGE_NAMES+=("$1"); STAGE_RESULTS+=("$2"); STAGE_NOTES+=("${3:-}"); }

# run_stage NAME CMD...: runs CMD, records PASS or FAIL; never stops the script.
run_stage() {
  local name=$1 rc=0
  shift
  say "$name"
  STAGE_NOTE=""
  "$@" || rc=$?
  if ((rc == 0)); then
    record "$name" PASS "$STAGE_NOTE"
  else
    record "$name" FAIL "exit status $rc${STAGE_NOTE:+; $STAGE_NOTE}"
  fi
}

# ------------------------------------------------------------------ PostgreSQL
PG_UP=0
cleanup() {
  if ((PG_UP)); then
    scripts/pg.sh stop "$LEASH_PG_DIR" || echo "warning: could not stop PostgreSQL in $LEASH_PG_DIR" >&2
    PG_UP=0
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "starting a throwaway PostgreSQL"
if pg_env=$(scripts/pg.sh start) && eval "$pg_env"; then
  PG_UP=1
  echo "PostgreSQL on port $PGPORT, socket and data in $LEASH_PG_DIR"
else
  record "postgres" FAIL "scripts/pg.sh start failed; database tests will not run"
fi

# ------------------------------------------------------------------ helpers
build_tree() {
  local dir=$1
  shift
  cmake -S . -B "$dir" "$@" && cmake --build "$dir" -j"$JOBS"
}

# Sanitizer runtimes may need address-space randomisation off (high vm.mmap_rnd_bits
# breaks TSan/ASan of GCC 12); setarch -R does that for the process tree, where allowed.
NORAND=()
if command -v setarch >/dev/null 2>&1 && setarch "$(uname -m)" -R true 2>/dev/null; then
  NORAND=(setarch "$(uname -m)" -R)
fi

# count_tests DIR [ctest filter args...]: how many tests ctest would run.
count_tests() {
  local dir=$1
  shift
  ctest --test-dir "$dir" -N "$@" 2>/dev/null | sed -n 's/^Total Tests: \([0-9]*\)$/\1/p'
}

stage_ctest() {
  build_tree build -DLEASH_ASAN=OFF -DLEASH_TSAN=OFF || { STAGE_NOTE="build failed"; return 1; }
  ctest --test-dir build -LE valgrind --output-on-failure -j"$JOBS" --no-tests=error
}

stage_asan() {
  build_tree build-asan -DLEASH_ASAN=ON -DLEASH_TSAN=OFF || { STAGE_NOTE="build failed"; return 1; }
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "${NORAND[@]}" ctest --test-dir build-asan -LE 'valgrind|chaos' --output-on-failure -j"$JOBS" --no-tests=error
}

stage_tsan() {
  build_tree build-tsan -DLEASH_ASAN=OFF -DLEASH_TSAN=ON || { STAGE_NOTE="build failed"; return 1; }
  local n
  n=$(count_tests build-tsan -L concurrent)
  STAGE_NOTE="${n:-0} test(s) labelled concurrent"
  echo "$STAGE_NOTE"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "${NORAND[@]}" ctest --test-dir build-tsan -L concurrent --output-on-failure --no-tests=ignore
}

stage_busted() {
  lua5.4 /usr/bin/busted --lpath='./scripts/lib/?.lua;./scripts/lib/?/init.lua;./scripts/?.lua' \
    tests/lua
}

# Valgrind: memcheck over the tests labelled "valgrind" (they read LEASH_VALGRIND=1 and
# wrap the binary in valgrind themselves). Runs only once some test carries the label.
stage_valgrind() {
  ctest --test-dir build -L valgrind --output-on-failure -j"$JOBS" --no-tests=ignore
}

# Fuzz: tests/fuzz's targets built with clang (-fsanitize=fuzzer,address,undefined); ctest's
# fuzz.<target> replays the crash regressions, then fuzzes a scratch copy of the corpus for
# LEASH_FUZZ_SECONDS (20) each. Only the fuzz targets are built in this tree.
stage_fuzz() {
  if ! { cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DLEASH_FUZZ=ON &&
         cmake --build build-fuzz -j"$JOBS" --target fuzz; }; then
    STAGE_NOTE="build failed"
    return 1
  fi
  "${NORAND[@]}" ctest --test-dir build-fuzz -L fuzz --output-on-failure -j"$JOBS" --no-tests=error
}

# libFuzzer's runtime comes with libclang-rt-*-dev; without it, -fsanitize=fuzzer cannot link.
have_libfuzzer() {
  command -v clang >/dev/null 2>&1 || return 1
  local dir rc=0
  dir=$(mktemp -d)
  printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\n%s\n' \
    'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' |
    clang -x c -fsanitize=fuzzer -o "$dir/probe" - >/dev/null 2>&1 || rc=1
  rm -rf "$dir"
  return "$rc"
}

# ------------------------------------------------------------------ stages
run_stage "ctest" stage_ctest

if ((QUICK)); then
  record "ctest asan" SKIP "LEASH_TEST_QUICK=1"
  record "ctest tsan" SKIP "LEASH_TEST_QUICK=1"
else
  run_stage "ctest asan" stage_asan
  run_stage "ctest tsan" stage_tsan
fi

if [[ -n $(find tests/lua -name '*_spec.lua' -print -quit 2>/dev/null) ]]; then
  run_stage "busted" stage_busted
else
  record "busted" SKIP "no tests/lua/*_spec.lua"
fi

n_valgrind=0
[[ ! -d build ]] || n_valgrind=$(count_tests build -L valgrind)
if ((${n_valgrind:-0} > 0)); then
  run_stage "valgrind" stage_valgrind
else
  record "valgrind" SKIP "no test labelled valgrind"
fi

if ((QUICK)); then
  record "fuzz" SKIP "LEASH_TEST_QUICK=1"
elif have_libfuzzer; then
  run_stage "fuzz" stage_fuzz
else
  record "fuzz" SKIP "clang with libFuzzer not available (packages clang, libclang-rt-14-dev)"
fi

cleanup

# ------------------------------------------------------------------ summary
passed=0 failed=0
say "summary"
for i in "${!STAGE_NAMES[@]}"; do
  printf '  %-4s  %-12s %s\n' "${STAGE_RESULTS[i]}" "${STAGE_NAMES[i]}" "${STAGE_NOTES[i]}"
  case ${STAGE_RESULTS[i]} in
    PASS) passed=$((passed + 1)) ;;
    FAIL) failed=$((failed + 1)) ;;
  esac
done
echo "$passed passed, $failed failed"
((failed == 0))
