#!/usr/bin/env bash
# The trees of an A/B run (`scripts/device-session.sh abtree`, AB_TREES): each NAME=REV given
# becomes .ab-NAME, REV's files (git archive; bench/results and docs left out, which no build
# reads), in the repository root. They are untracked and not ignored, so that a copy of the
# working tree carries them to the GPU machine; their builds (.ab-*/build-old) are ignored.
# Each build records NAME as its commit in the bench's JSON (bench/ab_table.py groups by it).
# NAME=REV+PATCH[+PATCH...]: REV's files with each patch applied in turn (`git apply`; a patch
# path as given from the current directory, else from the repository root): an experiment kept
# as a patch file in bench/experiments/, since a branch that did not land does not outlive its
# checkout. A patch's "# Requires: OTHER.patch" header lines name patches that must come before
# it in the same spec. Every spec is checked before any tree is made.
#   scripts/ab-trees.sh d51a7f3=d51a7f3 fin=4935d07+bench/experiments/finalize-gemm2-row-ahead.patch
#   scripts/ab-trees.sh --list      the trees there are, and what each came from
#   scripts/ab-trees.sh --clean     removes every .ab-* tree (move them away before a commit
#                                   rather, if a GPU machine has not built them yet)
set -euo pipefail
caller=$PWD
self=$(realpath "$0")
cd "$(dirname "$self")/.."
root=$(pwd -P)  # physical, as realpath gives the patches' paths
if [[ $# -eq 0 ]]; then sed -n '2,15p' "$self" | sed 's/^# \{0,1\}//'; exit 2; fi
shopt -s nullglob
case $1 in
  --list)
    trees=(.ab-*/)
    [[ ${#trees[@]} -gt 0 ]] || echo "no .ab-* trees in $root"
    for t in "${trees[@]}"; do echo "${t%/} $(cat "$t/.ab-commit" 2>/dev/null || echo '?')"; done
    exit 0 ;;
  --clean)
    trees=(.ab-*/)
    rm -rf "${trees[@]}"
    echo "removed ${#trees[@]} .ab-* tree(s) from $root"; exit 0 ;;
esac
fail() { echo "ab-trees.sh: $*" >&2; exit 2; }

# Every spec checked first: name, commit, patch files and their prerequisites.
names=(); shas=(); patch_lists=(); whats=()
for spec in "$@"; do
  name=${spec%%=*}; rest=${spec#*=}
  rev=${rest%%+*}
  if [[ $spec != *=* || -z $name || -z $rev || ! $name =~ ^[A-Za-z0-9_-]+$ ]]; then
    fail "'$spec' is not NAME=REV[+PATCH...] (NAME of letters, digits, - and _)"
  fi
  for other in "${names[@]}"; do [[ $other != "$name" ]] || fail "two specs name the tree .ab-$name"; done
  given=()
  if [[ $rest == *+* ]]; then IFS=+ read -r -a given <<< "${rest#*+}"; fi
  sha=$(git rev-parse --verify --quiet "$rev^{commit}") || fail "no commit '$rev'"
  what=$sha; resolved=()  # the patches' paths, in order
  for patch in "${given[@]}"; do
    if [[ $patch == /* && -f $patch ]]; then path=$(realpath "$patch")
    elif [[ -f $caller/$patch ]]; then path=$(realpath "$caller/$patch")
    elif [[ -f $root/$patch ]]; then path=$(realpath "$root/$patch")
    else fail "no patch file '$patch' (from $caller or $root)"; fi
    while read -r need; do
      [[ -n $need ]] || continue
      found=0
      for done_path in "${resolved[@]}"; do [[ $(basename "$done_path") == "$(basename "$need")" ]] && found=1; done
      ((found)) || fail "$patch requires $need before it in '$spec' (its '# Requires:' line)"
    done < <(tr -d '\r' < "$path" | sed -n -E 's/^# Requires: *([^ ]+).*$/\1/p')
    resolved+=("$path")
    shown=$path; [[ $path == "$root"/* ]] && shown=${path#"$root"/}  # from the root, where it lies there
    what+=" +$shown $(git hash-object "$path")"
  done
  dir=.ab-$name
  if [[ -e $dir && $(cat "$dir/.ab-commit" 2>/dev/null) != "$what" ]]; then
    fail "$dir exists from another commit or patch; remove it first (--clean)"
  fi
  names+=("$name"); shas+=("$sha"); whats+=("$what")
  patch_lists+=("$(printf '%s\n' "${resolved[@]}")")
done

for i in "${!names[@]}"; do
  dir=.ab-${names[$i]}; sha=${shas[$i]}; what=${whats[$i]}
  if [[ -e $dir ]]; then echo "$dir: $what (kept)"; continue; fi
  mkdir "$dir"
  git archive "$sha" | tar -x -C "$dir" --exclude=bench/results --exclude=docs
  while read -r path; do
    [[ -n $path ]] || continue
    if ! git apply --directory="$dir" "$path"; then
      rm -rf "$dir"; fail "$path does not apply to $sha's files (with the patches before it)"
    fi
  done <<< "${patch_lists[$i]}"
  echo "$what" > "$dir/.ab-commit"
  echo "$dir: $what"
done
