#!/usr/bin/env bash
# make lint-deploy: checks deploy/ with the tools platform teams trust.
#   systemd:    systemd-analyze verify (any warning fails) and systemd-analyze security --offline=yes --threshold=2
#   Kubernetes: render base and overlays (kubectl kustomize, else deploy/lint/kustomize.py; both when kubectl
#               exists, and they must agree), validate built-in kinds with kubernetes-validate (strict, offline
#               schemas) and the ServiceMonitor/ScaledObject with validators generated from their published CRDs
#   Prometheus: promtool check rules + promtool test rules, and the PrometheusRule holds the plain file's rules
#   Grafana:    the dashboard is valid JSON (tests/it/deploy.rs checks its queries against the exported metrics)
# Tools it installs go under target/lint-deploy/ (a Python venv, npm packages), pinned below.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERNETES_VALIDATE_VERSION=1.37.0
KUBERNETES_VERSION=1.33.0
PYYAML_VERSION=6.0.3
KEDA_MODELS_VERSION=2.0.0
PROMETHEUS_OPERATOR_MODELS_VERSION=6.0.0

WORK=target/lint-deploy
mkdir -p "$WORK"
say() { printf '\n== %s\n' "$*"; }
die() { printf 'lint-deploy: %s\n' "$*" >&2; exit 1; }

# --- systemd -------------------------------------------------------------------------------------------------
say "systemd: deploy/systemd/batchd.service"
if ! command -v systemd-analyze >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "systemd-analyze is missing; installing Debian's systemd package (it is not started)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
    else
        die "systemd-analyze is missing: install the systemd package (apt-get install systemd) and rerun"
    fi
fi
# verify wants the ExecStart binary and the system's units to exist: give it a private root with both, so the
# check does not depend on batchd being installed here.
root="$WORK/systemd-root"
rm -rf "$root" && mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
units=/usr/lib/systemd/system; [ -d "$units" ] || units=/lib/systemd/system
cp -r "$units" "$root/usr/lib/systemd/system"
printf '#!/bin/sh\nexit 0\n' > "$root/usr/local/bin/batchd" && chmod +x "$root/usr/local/bin/batchd"
verify() {  # unit file -> prints every message of systemd-analyze verify, fails on any
    cp "$1" "$root/etc/systemd/system/batchd.service"
    local out status=0
    out=$(SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no --root="$root" batchd.service 2>&1) || status=$?
    printf '%s' "$out"
    [ "$status" = 0 ] && [ -z "$out" ]
}
# The check must be able to fail: a unit with a bad key has to produce a warning.
sed 's/^Restart=on-failure$/Restart=on-failure\nNoSuchSetting=1/' deploy/systemd/batchd.service > "$WORK/bad.service"
if verify "$WORK/bad.service" >/dev/null; then die "systemd-analyze verify did not flag an unknown key; the check is blind"; fi
if ! verify deploy/systemd/batchd.service; then die "systemd-analyze verify reported the messages above"; fi
echo "verify: no warnings"
# --threshold counts in tenths on systemd's 0-100 scale (its default is 100): 20 means an overall exposure of at
# most 2.0 as printed. (Read literally, --threshold=2 would demand 0.2, below what any daemon that must open
# Internet sockets can score: network access alone costs more.)
security=$(systemd-analyze security --offline=yes --threshold=20 --no-pager deploy/systemd/batchd.service) \
    || die "systemd-analyze security: exposure above 2.0:\n$security"
exposure=$(printf '%s\n' "$security" | sed -n 's/.*Overall exposure level for batchd.service: \([0-9.]*\).*/\1/p')
[ -n "$exposure" ] || die "systemd-analyze security printed no exposure level"
awk -v e="$exposure" 'BEGIN { exit !(e <= 2.0) }' || die "exposure $exposure is above 2.0"
echo "security: overall exposure $exposure (at most 2.0 allowed)"

# --- Kubernetes ----------------------------------------------------------------------------------------------
say "Kubernetes: deploy/kubernetes"
venv="$WORK/venv"
if ! "$venv/bin/python" -c "import kubernetes_validate, yaml; assert kubernetes_validate.__version__ == '$KUBERNETES_VALIDATE_VERSION'" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" "pyyaml==$PYYAML_VERSION"
fi
rendered=()
for dir in deploy/kubernetes/base deploy/kubernetes/ui deploy/kubernetes/overlays/*/; do
    dir=${dir%/}
    out="$WORK/$(echo "$dir" | tr '/' '_').yaml"
    "$venv/bin/python" deploy/lint/kustomize.py "$dir" > "$out.py"
    if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
        kubectl kustomize "$dir" > "$out"
        "$venv/bin/python" - "$out" "$out.py" <<'PY'
import sys, yaml
def objects(path):
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
            for o in yaml.safe_load_all(open(path, encoding="utf-8")) if o}
kubectl, fallback = objects(sys.argv[1]), objects(sys.argv[2])
if kubectl != fallback:
    sys.exit(f"deploy/lint/kustomize.py disagrees with kubectl kustomize: {sorted(set(kubectl) ^ set(fallback))}")
PY
        echo "rendered $dir with kubectl kustomize ($(kubectl version --client 2>/dev/null | grep -i kustomize || true)); deploy/lint/kustomize.py agrees"
    else
        mv "$out.py" "$out"
        echo "rendered $dir with deploy/lint/kustomize.py (no kubectl here)"
    fi
    rendered+=("$out")
done
"$venv/bin/python" deploy/lint/validate.py "$KUBERNETES_VERSION" "$WORK/crds.json" "${rendered[@]}"

command -v node >/dev/null || die "node is missing: it runs the CRD validators (apt-get install nodejs)"
node_dir="$WORK/node"
mkdir -p "$node_dir"
if [ ! -f "$node_dir/node_modules/@kubernetes-models/keda/package.json" ] \
   || ! grep -q "\"version\": \"$KEDA_MODELS_VERSION\"" "$node_dir/node_modules/@kubernetes-models/keda/package.json"; then
    (cd "$node_dir" && echo '{"private": true}' > package.json \
        && npm install --silent --no-audit --no-fund --no-save \
            "@kubernetes-models/keda@$KEDA_MODELS_VERSION" \
            "@kubernetes-models/prometheus-operator@$PROMETHEUS_OPERATOR_MODELS_VERSION")
fi
cp deploy/lint/validate-crds.mjs "$node_dir/validate-crds.mjs"
node "$node_dir/validate-crds.mjs" "$WORK/crds.json"

# --- Prometheus rules ----------------------------------------------------------------------------------------
say "Prometheus: deploy/prometheus/batchd-rules.yml and the PrometheusRule"
command -v promtool >/dev/null || die "promtool is missing: make deps installs it (Debian's prometheus package)"
promtool check rules deploy/prometheus/batchd-rules.yml
(cd deploy/prometheus && promtool test rules batchd-rules.test.yml)
"$venv/bin/python" - deploy/prometheus/batchd-rules.yml deploy/kubernetes/base/prometheusrule.yaml <<'PY'
import sys, yaml
plain = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))["groups"]
operator = yaml.safe_load(open(sys.argv[2], encoding="utf-8"))["spec"]["groups"]
if plain != operator:
    sys.exit(f"{sys.argv[2]} and {sys.argv[1]} hold different rules: keep them the same")
print(f"the PrometheusRule holds the same {sum(len(g['rules']) for g in plain)} rules as the plain rules file")
PY

# --- Grafana -------------------------------------------------------------------------------------------------
say "Grafana: deploy/grafana/batchd.json"
"$venv/bin/python" -c 'import json, sys; print("valid JSON,", len(json.load(open(sys.argv[1]))["panels"]), "panels")' deploy/grafana/batchd.json

say "lint-deploy: all checks passed"
