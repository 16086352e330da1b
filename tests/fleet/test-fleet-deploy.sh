#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# The deployment pieces of a fleet (docs/fleet.md, "Deployment"), without a
# Kubernetes cluster. TAP, the plan last:
#  - deploy/kubernetes is clean under yamllint -s (yamllint missing fails), each
#    manifest parses, and kustomization.yaml lists every other one;
#  - every option the manifests, the fleet's units and their settings examples
#    give forkd or forkd-rest (and every --fleet-* word, comments included) is
#    one that its --help names: a renamed option fails here;
#  - each unit's ExecStart= uses only variables its settings example sets, and
#    the units pass systemd-analyze verify with the built forkd-rest;
#  - node.yaml's and front.yaml's pods, their containers run here as the pods
#    would, and the units' ExecStart= with the settings examples, against a
#    one-member etcd (tests/fleet/deploy-manifests.py run): the node's REST API
#    answers over the pod's bus, its record reaches etcd, the front end sees it.
# Environment: FORKD_BUILD_DIR (the meson build directory), FORKD_TOP.

set -u
top=${FORKD_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${FORKD_BUILD_DIR:-$top/build}
k8s=$top/deploy/kubernetes
units=(forkd-rest-fleet.service forkd-rest-front.service)
helper=$top/tests/fleet/deploy-manifests.py
# Debian's python3 first, which python3-yaml is for (not a pyenv's earlier in PATH).
py=$(command -v /usr/bin/python3 || command -v python3)
declare -A bin=([forkd]=$build/src/daemon/forkd [forkd-rest]=$build/src/rest/forkd-rest)
n=0 failed=0

ok() { n=$((n + 1)); echo "ok $n - $*"; }
notok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $*"; }
diag() { sed 's/^/# /'; }

for p in "${!bin[@]}"; do
        [ -x "${bin[$p]}" ] || { echo "Bail out! ${bin[$p]} is not built"; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- the manifests ----
if ! command -v yamllint >/dev/null; then
        notok "yamllint -s deploy/kubernetes: yamllint is not installed (Debian's yamllint; tools/install-deps installs it)"
elif out=$(cd "$k8s" && yamllint -s . 2>&1); then
        ok "yamllint -s deploy/kubernetes"
else
        notok "yamllint -s deploy/kubernetes"
        diag <<<"$out"
fi

have_yaml=0
"$py" -c 'import yaml' 2>/dev/null && have_yaml=1
no_yaml="python3-yaml is not installed (yamllint comes with it)"
for f in "$k8s"/*.yaml; do
        name=deploy/kubernetes/$(basename "$f")
        if [ $have_yaml = 0 ]; then
                notok "$name parses as YAML: $no_yaml"
        elif out=$("$py" -c 'import sys, yaml; list(yaml.safe_load_all(open(sys.argv[1])))' "$f" 2>&1); then
                ok "$name parses as YAML"
        else
                notok "$name parses as YAML"
                diag <<<"$out"
        fi
done
if [ $have_yaml = 1 ]; then
        listed=$("$py" -c 'import sys, yaml; print("\n".join(sorted(yaml.safe_load(open(sys.argv[1]))["resources"])))' \
                 "$k8s/kustomization.yaml" 2>&1)
        present=$(for f in "$k8s"/*.yaml; do f=${f##*/}; [ "$f" = kustomization.yaml ] || echo "$f"; done | sort)
        if [ "$listed" = "$present" ]; then
                ok "kustomization.yaml lists every manifest: ${listed//$'\n'/ }"
        else
                notok "kustomization.yaml lists every manifest"
                diff <(echo "$present") <(echo "$listed") | diag
        fi
fi

# ---- the options: PROGRAM OPTION WHERE, one a line ----
{
        if [ $have_yaml = 1 ]; then
                for f in "$k8s"/*.yaml; do
                        "$py" "$helper" flags "$f" | sed "s|\$| $(basename "$f")|"
                done
        else
                echo "manifests - -"
        fi
        for f in "$k8s"/*; do
                grep -ohE -- '--fleet-[a-z0-9-]+' "$f" | sed "s|^|forkd-rest |; s|\$| $(basename "$f")|"
        done
        for u in "${units[@]}"; do
                { sed -n 's/^ExecStart=//p' "$top/units/$u" | tr ' ' '\n' | grep -E -- '^--[a-z]'
                  grep -ohE -- '--fleet-[a-z0-9-]+' "$top/units/$u"; } | sed "s|^|forkd-rest |; s|\$| $u|"
                env=$(sed -n 's|^EnvironmentFile=-\{0,1\}/etc/forkd/||p' "$top/units/$u").example
                grep -ohE -- '--[a-z][a-z0-9-]+' "$top/units/$env" | sed "s|^|forkd-rest |; s|\$| $env|"
        done
} >"$tmp/flags"
for p in "${!bin[@]}"; do
        "${bin[$p]}" --help >"$tmp/help-$p" 2>&1
done
while read -r prog flag where; do
        if [ "$prog" = manifests ]; then
                notok "the options the manifests' containers give forkd and forkd-rest: $no_yaml"
        elif grep -qE -- "(^|[[:space:],])$flag([[:space:]=,]|\$)" "$tmp/help-$prog"; then
                ok "$prog --help names $flag ($where)"
        else
                notok "$prog --help names $flag ($where)"
        fi
done < <(awk '{ k = $1 " " $2
               if (!(k in src)) { order[++m] = k; src[k] = $3 }
               else if (index(", " src[k] ",", ", " $3 ",") == 0) src[k] = src[k] ", " $3 }
             END { for (i = 1; i <= m; i++) print order[i], src[order[i]] }' "$tmp/flags")

# ---- the units ----
for u in "${units[@]}"; do
        env=$(sed -n 's|^EnvironmentFile=-\{0,1\}/etc/forkd/||p' "$top/units/$u").example
        used=$(sed -n 's/^ExecStart=//p' "$top/units/$u" | grep -oE 'FORKD_[A-Z_]+' | sort -u)
        missing=$(for v in $used; do grep -q "^$v=" "$top/units/$env" || echo "$v"; done)
        if [ -n "$used" ] && [ -z "$missing" ]; then
                ok "$u: units/$env sets what its ExecStart= uses (${used//$'\n'/ })"
        else
                notok "$u: units/$env sets what its ExecStart= uses: missing ${missing//$'\n'/ }"
        fi
done
if command -v systemd-analyze >/dev/null; then
        for u in "${units[@]}"; do
                sed "s|@BINDIR@|$build/src/rest|g" "$top/units/$u" >"$tmp/$u"
                if out=$(systemd-analyze verify --man=no "$tmp/$u" 2>&1) && [ -z "$out" ]; then
                        ok "$u passes systemd-analyze verify"
                else
                        notok "$u passes systemd-analyze verify"
                        diag <<<"$out"
                fi
        done
else
        for u in "${units[@]}"; do ok "$u passes systemd-analyze verify # SKIP systemd-analyze is not installed"; done
fi

# ---- the pods and the units, run here ----
if [ $have_yaml = 0 ]; then
        notok "node.yaml's and front.yaml's pods and the units, run here: $no_yaml"
else
        out=$("$py" "$helper" run 2>&1)
        rc=$?
        if [ $rc = 77 ]; then
                ok "node.yaml's and front.yaml's pods and the units, run here # SKIP $out"
        else
                while IFS= read -r line; do
                        case $line in
                        "ok - "*) ok "${line#ok - }" ;;
                        "not ok - "*) notok "${line#not ok - }" ;;
                        "#"*) echo "$line" ;;
                        *) echo "# $line" ;;
                        esac
                done <<<"$out"
                [ $rc = 0 ] || [ $failed != 0 ] || notok "tests/fleet/deploy-manifests.py run exited with $rc"
        fi
fi

echo "1..$n"
[ $failed = 0 ]
