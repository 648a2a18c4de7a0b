#!/usr/bin/env bash
# scripts/ab-trees.sh NAME=REV+PATCH (an experiment kept as a patch file): the tree holds REV's
# files with the patch applied and records both; the same spec again keeps it; a patch that does
# not apply leaves no tree and an error. Needs git and a checkout (no GPU, no build).
set -euo pipefail
cd "$(dirname "$0")/../.."
git rev-parse --verify --quiet HEAD >/dev/null || { echo "not a git checkout with a commit: skipped"; exit 0; }
name=citest$$
dir=.ab-$name
tmp=$(mktemp -d)
trap 'rm -rf "$dir" "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# A patch of one line of a file git archive carries (the tree leaves docs/ and bench/results out).
file=CMakeLists.txt
git show HEAD:$file > "$tmp/a"
{ printf -- '--- a/%s\n+++ b/%s\n@@ -1,3 +1,4 @@\n+# ab-trees test line\n' $file $file; head -3 "$tmp/a" | sed 's/^/ /'; } > "$tmp/one.patch"

scripts/ab-trees.sh "$name=HEAD+$tmp/one.patch" > "$tmp/out" || fail "ab-trees.sh failed: $(cat "$tmp/out")"
[[ $(head -1 "$dir/$file") == "# ab-trees test line" ]] || fail "the patch was not applied to $dir/$file"
cmp -s <(tail -n +2 "$dir/$file") "$tmp/a" || fail "$dir/$file is not HEAD's file with the patch"
grep -q "+$tmp/one.patch " "$dir/.ab-commit" || fail ".ab-commit does not name the patch: $(cat "$dir/.ab-commit")"
scripts/ab-trees.sh "$name=HEAD+$tmp/one.patch" | grep -q "(kept)" || fail "the same spec again did not keep the tree"
if scripts/ab-trees.sh "$name=HEAD" 2>/dev/null; then fail "another spec for an existing tree was accepted"; fi
rm -rf "$dir"

# A patch that does not apply: an error, and no tree left behind.
sed 's/^ \(.*\)$/ \1 changed/' "$tmp/one.patch" > "$tmp/bad.patch"
if scripts/ab-trees.sh "$name=HEAD+$tmp/bad.patch" 2>"$tmp/err"; then fail "a patch that does not apply was accepted"; fi
grep -q "does not apply" "$tmp/err" || fail "no 'does not apply' error: $(cat "$tmp/err")"
[[ ! -e $dir ]] || fail "a failed patch left $dir behind"
if scripts/ab-trees.sh "$name=HEAD+$tmp/missing.patch" 2>/dev/null; then fail "a missing patch file was accepted"; fi

# A patch whose "# Requires:" names another: refused alone, made after it.
{ echo "# Requires: one.patch"; printf -- '--- a/%s\n+++ b/%s\n@@ -1,3 +1,4 @@\n+# second line\n' $file $file
  { echo "# ab-trees test line"; head -2 "$tmp/a"; } | sed 's/^/ /'; } > "$tmp/two.patch"
if scripts/ab-trees.sh "$name=HEAD+$tmp/two.patch" 2>"$tmp/err"; then fail "a patch without its prerequisite was accepted"; fi
grep -q "requires one.patch" "$tmp/err" || fail "no 'requires' error: $(cat "$tmp/err")"
[[ ! -e $dir ]] || fail "a refused spec left $dir behind"
scripts/ab-trees.sh "$name=HEAD+$tmp/one.patch+$tmp/two.patch" > /dev/null || fail "the two patches in order failed"
[[ $(sed -n 2p "$dir/$file") == "# ab-trees test line" && $(head -1 "$dir/$file") == "# second line" ]] ||
  fail "the two patches were not both applied: $(head -2 "$dir/$file")"
rm -rf "$dir"

# Every spec is checked before any tree is made; a patch path may be given from the current
# directory.
if scripts/ab-trees.sh "$name=HEAD" "bad name=HEAD" 2>/dev/null; then fail "a bad spec was accepted"; fi
[[ ! -e $dir ]] || fail "a good spec's tree was made before a bad spec was refused"
cp "$tmp/one.patch" tests/tools/.ab-trees-test-$$.patch
trap 'rm -rf "$dir" "$tmp" tests/tools/.ab-trees-test-$$.patch' EXIT
(cd tests && ../scripts/ab-trees.sh "$name=HEAD+tools/.ab-trees-test-$$.patch" > /dev/null) ||
  fail "a patch path from the current directory was not found"
grep -q "+tests/tools/.ab-trees-test-$$.patch " "$dir/.ab-commit" || fail "the patch is not named from the root: $(cat "$dir/.ab-commit")"
# Into a file first: grep -q ends at its first match, and under pipefail the list's writer then
# fails with SIGPIPE where other trees follow (a developer's checkout with trees of its own).
scripts/ab-trees.sh --list > "$tmp/list"
grep -q "^$dir " "$tmp/list" || fail "--list does not show $dir"
echo "ab-trees.sh: patched trees made, kept, refused as they should"
