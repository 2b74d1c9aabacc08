#!/usr/bin/env bash
# Recreate the exp/* tags of the levers that left main, from the table in docs/results/index.md.
#
# Tags are local refs that a clone may lack. Each row of that table is
#   | `exp/NAME` | `COMMIT` | what it holds | result |
# and this script runs `git tag -f exp/NAME COMMIT` when the repository holds COMMIT, and warns
# (exit status 0) when it does not: one commit (exp/fused-capture) was never on main.
# Usage: bash scripts/tags.sh [--dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
table=docs/results/index.md
dry=0
[[ "${1:-}" == "--dry-run" ]] && dry=1

made=0
missing=0
while IFS=$'\t' read -r tag commit; do
    if git cat-file -e "${commit}^{commit}" 2>/dev/null; then
        if [[ $dry == 1 ]]; then
            echo "would tag $tag $commit"
        else
            git tag -f "$tag" "$commit" >/dev/null
            echo "tagged $tag $(git rev-parse --short=12 "$tag")"
        fi
        made=$((made + 1))
    else
        echo "warning: $tag: commit $commit is not in this repository; tag not made" >&2
        missing=$((missing + 1))
    fi
done < <(sed -nE 's/^\|[[:space:]]*`(exp\/[A-Za-z0-9._\/-]+)`[[:space:]]*\|[[:space:]]*`([0-9a-f]{7,40})`[[:space:]]*\|.*/\1\t\2/p' "$table")

if [[ $((made + missing)) == 0 ]]; then
    echo "scripts/tags.sh: no exp/* rows found in $table" >&2
    exit 1
fi
echo "$made tags made, $missing commits missing"
