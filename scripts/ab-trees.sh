#!/usr/bin/env bash
# The trees of an A/B run (`scripts/device-session.sh abtree`, AB_TREES): each NAME=REV given
# becomes .ab-NAME, REV's files (git archive; bench/results and docs left out, which no build
# reads), in the repository root. They are untracked and not ignored, so that a copy of the
# working tree carries them to the GPU machine; their builds (.ab-*/build-old) are ignored.
# Each build records NAME as its commit in the bench's JSON (bench/ab_table.py groups by it).
#   scripts/ab-trees.sh main=HEAD d51a7f3=d51a7f3 chk=exp/check-after-epilogue
#   scripts/ab-trees.sh --list      the trees there are, and the commit each came from
#   scripts/ab-trees.sh --clean     removes every .ab-* tree (move them away before a commit
#                                   rather, if a GPU machine has not built them yet)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; fi
case $1 in
  --list)
    for t in .ab-*/; do [[ -d $t ]] && echo "${t%/} $(cat "$t/.ab-commit" 2>/dev/null || echo '?')"; done; exit 0 ;;
  --clean)
    rm -rf .ab-*/; exit 0 ;;
esac
for spec in "$@"; do
  name=${spec%%=*}; rev=${spec#*=}
  if [[ $spec != *=* || -z $name || -z $rev || ! $name =~ ^[A-Za-z0-9_-]+$ ]]; then
    echo "ab-trees.sh: '$spec' is not NAME=REV (NAME of letters, digits, - and _)" >&2; exit 2
  fi
  sha=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "ab-trees.sh: no commit '$rev'" >&2; exit 2; }
  dir=.ab-$name
  if [[ -e $dir ]]; then
    if [[ $(cat "$dir/.ab-commit" 2>/dev/null) == "$sha" ]]; then echo "$dir: $sha (kept)"; continue; fi
    echo "ab-trees.sh: $dir exists from another commit; remove it first (--clean)" >&2; exit 2
  fi
  mkdir "$dir"
  git archive "$sha" | tar -x -C "$dir" --exclude=bench/results --exclude=docs
  echo "$sha" > "$dir/.ab-commit"
  echo "$dir: $sha"
done
