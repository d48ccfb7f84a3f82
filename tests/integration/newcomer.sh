#!/usr/bin/env bash
# The README's "Your first task", followed literally, so the docs cannot rot. Each code block
# of that section is marked by the HTML comment before it:
#   <!-- first-task: PATH -->  the block is the file PATH (and must equal the repository's copy)
#   <!-- first-task: run -->   the block is shell, run in order as a newcomer would type it
# The run blocks execute in a scratch folder that looks like a checkout (scripts/ and
# build/leash link to the real ones; the example files are written from the README's text,
# not copied), against a fresh database named by DATABASE_URL, as the section says.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"

README=$LEASH_SRC/README.md

# extract OUT_DIR: writes the section's blocks as OUT_DIR/files/<PATH> and OUT_DIR/run.sh (the
# run blocks in order), and OUT_DIR/order (one marker per line, in README order).
extract() {
  python3 - "$README" "$1" <<'PY'
import os, re, sys
readme, out = sys.argv[1], sys.argv[2]
text = open(readme, encoding="utf-8").read()
m = re.search(r"^## Your first task\n(.*?)^## ", text, re.S | re.M)
if not m:
    sys.exit("README.md has no '## Your first task' section")
blocks = re.findall(r"<!-- first-task: (\S+) -->\n```[a-z]*\n(.*?)^```\n", m.group(1), re.S | re.M)
if not blocks:
    sys.exit("the first-task section has no marked code blocks")
markers = re.findall(r"<!-- first-task: (\S+) -->", m.group(1))
if len(markers) != len(blocks):
    sys.exit(f"{len(markers)} markers but {len(blocks)} marked code blocks (a marker must sit right above its block)")
run = ["set -euo pipefail"]
with open(os.path.join(out, "order"), "w") as order:
    for name, body in blocks:
        order.write(name + "\n")
        if name == "run":
            run.append(body)
        else:
            if name.startswith("/") or ".." in name.split("/"):
                sys.exit(f"a file block names {name!r}, outside the checkout")
            path = os.path.join(out, "files", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(body)
with open(os.path.join(out, "run.sh"), "w", encoding="utf-8") as f:
    f.write("\n".join(run))
PY
}

# 1. The files the README shows are the files in examples/, and the section goes in the
# order a newcomer needs: the script, its spec, busted, leash check, leash run --until-empty.
case_the_first_task_blocks_are_the_example_files_in_order() {
  local out=$T_TMP/x f n=0
  mkdir -p "$out"
  extract "$out" || fail "could not extract the first-task blocks"
  while IFS= read -r f; do
    [[ $f == run ]] && continue
    n=$((n + 1))
    [[ -f $LEASH_SRC/$f ]] || fail "the README shows $f, which is not in the repository"
    diff -u "$LEASH_SRC/$f" "$out/files/$f" >"$T_TMP/diff" ||
      fail "the README's $f differs from the repository's:"$'\n'"$(cat "$T_TMP/diff")"
  done <"$out/order"
  assert_eq "file blocks" "$n" 2
  assert_eq "block order" "$(tr '\n' ' ' <"$out/order")" \
    "examples/first-task/grade.lua examples/first-task/grade_spec.lua run run run "
  # The commands, in order, within the run blocks.
  awk '/busted /{print "busted"} /leash check /{print "check"} /leash run .*--until-empty/{print "run"}' \
    "$out/run.sh" >"$T_TMP/cmds"
  assert_eq "commands in order" "$(tr '\n' ' ' <"$T_TMP/cmds")" "busted check run "
  # Before any internals: the section is the second one, right after "Two commands".
  assert_eq "first sections" "$(grep '^## ' "$README" | head -2 | tr '\n' '|')" \
    "## Two commands|## Your first task|"
  # The script is the ~20-line one the section promises.
  n=$(wc -l <"$out/files/examples/first-task/grade.lua")
  ((n <= 25)) || fail "grade.lua has $n lines; the first task promises about 20"
}

# 2. The run blocks, as written, in a checkout-like folder: busted passes the spec, leash check
# accepts the script, the mock answers, and the enqueued ticket ends done with the mock's grade.
case_the_first_task_runs_as_written() {
  t_newdb
  local out=$T_TMP/x work=$T_TMP/work rc=0
  mkdir -p "$out" "$work/build"
  extract "$out" || fail "could not extract the first-task blocks"
  cp -R "$out/files/." "$work/"
  ln -s "$LEASH_SRC/scripts" "$work/scripts"
  ln -s "$LEASH" "$work/build/leash"
  # setsid: the blocks' background mock is in its own process group, which the clean-up
  # ends even when a block failed before its `kill`.
  (cd "$work" && exec setsid timeout 240 bash "$out/run.sh") >"$T_OUT" 2>"$T_ERR" &
  local pid=$!
  t_on_exit _kill_group "$pid"
  wait "$pid" || rc=$?
  ((rc == 0)) || fail "the first-task blocks failed (status $rc)"$'\n'"$(_t_tail stdout "$T_OUT")"$'\n'"$(_t_tail stderr "$T_ERR")"
  assert_contains "busted's summary" "$(cat "$T_OUT")" "3 successes / 0 failures / 0 errors"
  assert_contains "leash check" "$(cat "$T_OUT")" "examples/first-task/grade.lua: ok"
  assert_eq "tasks" "$(q "SELECT count(*) || ' ' || string_agg(status, ',') FROM agent_work_queue")" "1 done"
  local grade
  grade=$(q "SELECT result->>'grade' FROM agent_work_queue")
  [[ $grade =~ ^[1-5]$ ]] || fail "the task's result has no grade from the mock: $(q 'SELECT result FROM agent_work_queue')"
  assert_eq "batch" "$(q 'SELECT batch FROM agent_work_queue')" first-task
  assert_contains "inspect shows the task done" "$(cat "$T_OUT")" "done"
  # The mock really answered (it counts what it saw), and the block's `kill` stopped it.
  [[ -s $work/mock.out ]] || fail "the mock wrote no port"
  wait_for "the mock to be gone" 10 _group_gone "$pid"
}

# 3. The man page covers every command and flag: each command of `leash --help` has an entry
# in docs/leash.1, and every --option its own --help names (and each action of tenant, budget
# and spend) appears in that entry; the global options are in the SYNOPSIS.
case_the_man_page_names_every_command_and_option() {
  python3 - "$LEASH" "$LEASH_SRC/docs/leash.1" <<'PY' >"$T_OUT" || fail "docs/leash.1 is behind the binary's --help:"$'\n'"$(cat "$T_OUT")"
import re, subprocess, sys
leash, man = sys.argv[1], sys.argv[2]
GLOBAL = {"--db", "--table", "--log-format", "--log-level", "--help", "--version"}
top = subprocess.run([leash, "--help"], capture_output=True, text=True).stdout
cmds = re.findall(r"^  ([a-z]+)   ", top.split("commands:")[1].split("global options:")[0], re.M)
text = open(man, encoding="utf-8").read()
lines = text.split("\n")
chunks, cur = {}, None
for i, l in enumerate(lines):
    if l.startswith(".SH"):
        cur = None
        continue
    if i > 0 and lines[i - 1] in (".TP",) and re.match(r"\.BI? ", l):
        word = re.sub(r'^\.BI? "?', "", l).split()[0].strip('"')
        if word in cmds:
            cur = word
            chunks.setdefault(cur, "")
    if cur:
        chunks[cur] += l.replace("\\-", "-") + "\n"
syn = text.split(".SH DESCRIPTION")[0].replace("\\-", "-")
bad = []
for g in GLOBAL - {"--help", "--version"}:
    if g not in syn: bad.append(f"SYNOPSIS lacks the global option {g}")
for c in cmds:
    if c not in chunks:
        bad.append(f"no entry for the command {c}"); continue
    h = subprocess.run([leash, c, "--help"], capture_output=True, text=True).stdout
    h = h.split("global options:")[0]
    for f in sorted(set(re.findall(r"--[a-z][a-z0-9-]*", h)) - GLOBAL):
        if not re.search(re.escape(f) + r"(?![a-z0-9-])", chunks[c]):
            bad.append(f"{c}: {f} is in 'leash {c} --help' but not in its entry")
    for a in re.findall(r"^  ([a-z]+) [A-Z\[]", h, re.M) if c in ("budget", "spend", "tenant") else []:
        if not re.search(r"\b" + c + r" " + a + r"\b", chunks[c]):
            bad.append(f"{c}: the action {a} has no entry")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
}

# 4. docs/patterns.md shows its marked examples (<!-- example: PATH -->) exactly as the files in
# examples/patterns/ are, every file there is shown, the scripts pass leash check, and their
# specs pass under busted.
case_the_patterns_page_shows_the_example_files_and_their_specs_pass() {
  python3 - "$LEASH_SRC" >"$T_OUT" <<'PY' || fail "docs/patterns.md and examples/patterns/ differ:"$'\n'"$(cat "$T_OUT")"
import os, re, sys
root = sys.argv[1]
text = open(os.path.join(root, "docs/patterns.md"), encoding="utf-8").read()
blocks = re.findall(r"<!-- example: (\S+) -->\n```[a-z]*\n(.*?)^```\n", text, re.S | re.M)
shown = {name for name, _ in blocks}
bad = []
for name, body in blocks:
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        bad.append(f"{name} is shown but not in the repository")
    elif open(path, encoding="utf-8").read() != body:
        bad.append(f"{name} differs from the block that shows it")
for f in sorted(os.listdir(os.path.join(root, "examples/patterns"))):
    if "examples/patterns/" + f not in shown:
        bad.append(f"examples/patterns/{f} is not shown in docs/patterns.md")
if len(blocks) < 4:
    bad.append(f"only {len(blocks)} marked blocks")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
  local f
  for f in "$LEASH_SRC"/examples/patterns/*.lua; do
    [[ $f == *_spec.lua ]] && continue
    expect_exit 0 "$LEASH" check "$f"
  done
  (cd "$LEASH_SRC" && busted --lua=lua5.4 --lpath='./scripts/lib/?.lua' -o TAP examples/patterns/) >"$T_OUT" 2>&1 ||
    fail "the patterns' specs fail:"$'\n'"$(cat "$T_OUT")"
  grep -q '^ok ' "$T_OUT" || fail "busted ran no test: $(cat "$T_OUT")"
}

# 5. Every relative link in README.md and docs/*.md leads to a file that exists and, with a
# #fragment, to a heading of that file (GitHub's anchors), so moved sections leave no dead link.
case_every_link_in_the_docs_leads_somewhere() {
  python3 - "$LEASH_SRC" <<'PY' >"$T_OUT" || fail "dead links:"$'\n'"$(cat "$T_OUT")"
import os, re, sys
root = sys.argv[1]
def anchors(path):
    out = set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"): in_code = not in_code
        if in_code: continue
        m = re.match(r"^#{1,6} (.*)", line)
        if m:
            a = m.group(1).strip().lower()
            a = re.sub(r"[^\w\- ]", "", a).replace(" ", "-")
            out.add(a)
    return out
files = [os.path.join(root, "README.md")] + [os.path.join(root, "docs", f) for f in sorted(os.listdir(os.path.join(root, "docs"))) if f.endswith(".md")]
bad = []
for f in files:
    text = open(f, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target): continue
        path, _, frag = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        rel = os.path.relpath(f, root)
        if not os.path.exists(dest):
            bad.append(f"{rel}: ({target}): no such file"); continue
        if frag and dest.endswith(".md") and frag not in anchors(dest):
            bad.append(f"{rel}: ({target}): no such section")
print("\n".join(bad)); sys.exit(1 if bad else 0)
PY
}

_group_gone() { ! kill -0 -- "-$1" 2>/dev/null; }
_kill_group() { kill -TERM -- "-$1" 2>/dev/null || true; }

t_run "$@"
