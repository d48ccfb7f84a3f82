#!/usr/bin/env bash
# Runs one libFuzzer target: replays tests/fuzz/regressions/TARGET/ (each file once), then
# fuzzes a scratch copy of tests/fuzz/corpus/TARGET/ for SECONDS, so the repository's corpus
# is never written by a run. ctest's fuzz.<target> calls it for a short run; for long runs:
#
#   tests/fuzz/run.sh [--merge] TARGET SECONDS
#     TARGET   enqueue_line | json_lua | json_encode | pgvalue | duration | provider
#     --merge  afterwards, add the inputs that found new coverage to tests/fuzz/corpus/TARGET
#              (libFuzzer -merge=1: only what the corpus does not already cover)
#
# Environment: LEASH_FUZZ_BIN, the target binary (default: build-fuzz/fuzz_TARGET, configured
# with clang and built if missing); LEASH_FUZZ_WORK (default build-fuzz/fuzz-work): scratch
# corpora, the log (TARGET.log) and crash inputs (artifacts/TARGET/). LEASH_FUZZ_ARGS: extra
# libFuzzer flags (e.g. "-jobs=2 -workers=2" or "-max_len=65536").
# A crash input is kept in artifacts/TARGET/; once fixed, it goes into
# tests/fuzz/regressions/TARGET/ (and, when it is about behaviour, into a C test case).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

merge=0
if [[ ${1:-} == --merge ]]; then
  merge=1
  shift
fi
if (($# != 2)) || [[ ! $2 =~ ^[0-9]+$ ]]; then
  echo "usage: tests/fuzz/run.sh [--merge] TARGET SECONDS" >&2
  exit 2
fi
target=$1 seconds=$2
corpus=$here/corpus/$target
regressions=$here/regressions/$target
dict=$here/dict/$target.dict
[[ -d $corpus ]] || { echo "run.sh: no corpus $corpus" >&2; exit 2; }

bin=${LEASH_FUZZ_BIN:-}
if [[ -z $bin ]]; then
  bin=$root/build-fuzz/fuzz_$target
  if [[ ! -x $bin ]]; then
    cmake -S "$root" -B "$root/build-fuzz" -DCMAKE_C_COMPILER=clang -DLEASH_FUZZ=ON >/dev/null
    cmake --build "$root/build-fuzz" -j2 --target "fuzz_$target"
  fi
fi
work=${LEASH_FUZZ_WORK:-$(dirname "$bin")/fuzz-work}
artifacts=$work/artifacts/$target
log=$work/$target.log
mkdir -p "$work" "$artifacts"

common=(-rss_limit_mb=1024 -timeout=10 -artifact_prefix="$artifacts/")
[[ ! -f $dict ]] || common+=(-dict="$dict")
# shellcheck disable=SC2206  # word splitting of the extra flags is intended
extra=(${LEASH_FUZZ_ARGS:-})

# 1. Every crash found so far stays fixed.
shopt -s nullglob
replay=("$regressions"/*)
shopt -u nullglob
if ((${#replay[@]})); then
  echo "replaying ${#replay[@]} regression input(s) from tests/fuzz/regressions/$target"
  if ! "$bin" "${common[@]}" "${replay[@]}" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "run.sh: a regression input of $target fails again (log: $log)" >&2
    exit 1
  fi
fi

# 2. Fuzz a scratch copy; regressions join as a read-only second corpus.
scratch=$(mktemp -d "$work/$target.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cp -R "$corpus/." "$scratch/"
dirs=("$scratch")
[[ ! -d $regressions ]] || dirs+=("$regressions")
echo "fuzzing $target for ${seconds}s from $(find "$corpus" -type f | wc -l) corpus input(s)"
rc=0
"$bin" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 "${extra[@]}" \
  "${dirs[@]}" >"$log" 2>&1 || rc=$?
if ((rc != 0)); then
  tail -n 60 "$log"
  echo "run.sh: $target failed (exit $rc); crash inputs in $artifacts, log in $log" >&2
  exit 1
fi
# libFuzzer's own summary: executions, speed, coverage, corpus size
grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|stat::peak_rss_mb)' "$log" || true
grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true
echo "scratch corpus now $(find "$scratch" -type f | wc -l) input(s)"

# 3. On request, keep what found new coverage.
if ((merge)); then
  before=$(find "$corpus" -type f | wc -l)
  "$bin" "${common[@]}" -merge=1 "$corpus" "$scratch" >>"$log" 2>&1
  echo "merged into tests/fuzz/corpus/$target: $before -> $(find "$corpus" -type f | wc -l) input(s)"
fi
