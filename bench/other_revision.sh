#!/usr/bin/env bash
# Another revision of the code, installed as the package, for side-by-side benches
# (bench/search_latency.py --code NAME=DIR):
#   bash bench/other_revision.sh REV DIR
# DIR becomes a git worktree of REV, and DIR/.venv a virtual environment where `import heedrank` is REV's
# code: an editable install of DIR, so REV's own pyproject.toml says which folder is which module.
# Its dependencies are this checkout's .venv's (one .pth line): nothing is downloaded or built.
# Run a process on it with DIR/.venv/bin/python. Remove it with `git worktree remove --force DIR`.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bash bench/other_revision.sh REV DIR" >&2; exit 2; }
REV=$1; DIR=$2
cd "$(dirname "$0")/.."
MAIN_PY=$(pwd)/.venv/bin/python
[ -x "$MAIN_PY" ] || { echo "$MAIN_PY missing: run scripts/setup.sh first" >&2; exit 1; }
if [ -e "$DIR" ]; then
  # only an earlier worktree of this script is replaced; anything else is left alone
  git worktree remove --force "$DIR" || { echo "$DIR exists and is not a worktree: choose another DIR" >&2; exit 1; }
fi
git worktree add --detach "$DIR" "$REV" >/dev/null
DIR=$(cd "$DIR" && pwd)
"$MAIN_PY" -m venv --without-pip "$DIR/.venv"
purelib='import sysconfig; print(sysconfig.get_path("purelib"))'
# after the venv's own site-packages: REV's heedrank comes first, the dependencies come from this checkout's venv
"$MAIN_PY" -c "$purelib" > "$("$DIR/.venv/bin/python" -c "$purelib")/zz_main_venv_dependencies.pth"
"$MAIN_PY" -m pip --python "$DIR/.venv/bin/python" install --quiet --no-index --no-deps --no-build-isolation -e "$DIR"
got=$(cd / && "$DIR/.venv/bin/python" -c 'import heedrank; print(heedrank.__file__)')
case "$got" in "$DIR"/*) ;; *) echo "import heedrank gives $got, not $DIR's" >&2; exit 1;; esac
echo "$DIR: $(git rev-parse --short "$REV"), its interpreter $DIR/.venv/bin/python"
