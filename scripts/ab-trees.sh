#!/usr/bin/env bash
# The trees of an A/B run (`scripts/device-session.sh abtree`, AB_TREES): each NAME=REV given
# becomes .ab-NAME, REV's files (git archive; bench/results and docs left out, which no build
# reads), in the repository root. They are untracked and not ignored, so that a copy of the
# working tree carries them to the GPU machine; their builds (.ab-*/build-old) are ignored.
# Each build records NAME as its commit in the bench's JSON (bench/ab_table.py groups by it).
# NAME=REV+PATCH[+PATCH...]: REV's files with each patch applied in turn (`git apply`, paths as
# from the repository root): an experiment kept as a patch file in bench/experiments/, since a
# branch that did not land does not outlive its checkout.
#   scripts/ab-trees.sh main=HEAD d51a7f3=d51a7f3 lean=HEAD+bench/experiments/header-check-lean.patch
#   scripts/ab-trees.sh --list      the trees there are, and the commit each came from
#   scripts/ab-trees.sh --clean     removes every .ab-* tree (move them away before a commit
#                                   rather, if a GPU machine has not built them yet)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; fi
case $1 in
  --list)
    for t in .ab-*/; do [[ -d $t ]] && echo "${t%/} $(cat "$t/.ab-commit" 2>/dev/null || echo '?')"; done; exit 0 ;;
  --clean)
    rm -rf .ab-*/; exit 0 ;;
esac
for spec in "$@"; do
  name=${spec%%=*}; rest=${spec#*=}
  rev=${rest%%+*}
  if [[ $spec != *=* || -z $name || -z $rev || ! $name =~ ^[A-Za-z0-9_-]+$ ]]; then
    echo "ab-trees.sh: '$spec' is not NAME=REV[+PATCH...] (NAME of letters, digits, - and _)" >&2; exit 2
  fi
  patches=()
  if [[ $rest == *+* ]]; then IFS=+ read -r -a patches <<< "${rest#*+}"; fi
  sha=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "ab-trees.sh: no commit '$rev'" >&2; exit 2; }
  what=$sha
  for patch in "${patches[@]}"; do
    [[ -f $patch ]] || { echo "ab-trees.sh: no patch file '$patch'" >&2; exit 2; }
    what+=" +$patch $(git hash-object "$patch")"
  done
  dir=.ab-$name
  if [[ -e $dir ]]; then
    if [[ $(cat "$dir/.ab-commit" 2>/dev/null) == "$what" ]]; then echo "$dir: $what (kept)"; continue; fi
    echo "ab-trees.sh: $dir exists from another commit or patch; remove it first (--clean)" >&2; exit 2
  fi
  mkdir "$dir"
  git archive "$sha" | tar -x -C "$dir" --exclude=bench/results --exclude=docs
  for patch in "${patches[@]}"; do
    if ! git apply --directory="$dir" "$patch"; then
      rm -rf "$dir"; echo "ab-trees.sh: $patch does not apply to $rev's files" >&2; exit 2
    fi
  done
  echo "$what" > "$dir/.ab-commit"
  echo "$dir: $what"
done
