#!/usr/bin/env bash
# The README's quick start, its first task and the Rust examples' README, run as a newcomer
# pastes them: every command is read from the READMEs' ```sh blocks, none is copied here, so
# this fails as soon as the text and the product part ways. The README's test command runs
# it (before `cargo test`, which holds cargo's lock on target/ while tests run, so the
# quick start's own `cargo run` could not build from inside a test).
#
# It runs in the repository's folder, as the README says: `cargo run -p wasq -- dev` on its
# default port (7070) with its data in ./.wasq (both must be free), the tour in a second
# shell. On a fresh clone that first `cargo run` is the cold build a new user waits for: its
# time is printed. Everything the commands build with was fetched by tests/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

fail() { echo "tests/readme.sh: $*" >&2; exit 1; }

# The ```sh blocks of the section under heading $2 (up to the next "## ") of file $1, each
# line prefixed with the block's number and a tab.
sh_blocks() {
  awk -v heading="$2" '
    $0 == heading { inside = 1; next }
    inside && /^## / { exit }
    inside && /^```sh$/ { n++; code = 1; next }
    inside && code && /^```$/ { code = 0; next }
    inside && code { print n "\t" $0 }
  ' "$1"
}
# Block $3 of section $2 of file $1.
block() { sh_blocks "$1" "$2" | awk -F'\t' -v n="$3" '$1 == n { sub(/^[^\t]*\t/, ""); print }'; }
# A line without its trailing "  # comment".
command_of() { sed -E 's/  +#.*$//; s/[[:space:]]+$//' <<<"$1"; }

# 1. Two commands do everything; the second is what CI runs.
quick=$(block README.md "## Quick start" 1)
[ "$(wc -l <<<"$quick")" = 2 ] || fail "the quick start's first block is not two commands: $quick"
start=$(command_of "$(sed -n 1p <<<"$quick")")
tests=$(command_of "$(sed -n 2p <<<"$quick")")
[ "$start" = "cargo run -p wasq -- dev" ] || fail "the quick start starts with \`$start\`"
[ "$(tail -n 1 .ci/run | sed 's/[[:space:]]*$//')" = "$tests" ] \
  || fail "CI (.ci/run) does not run the README's test command \`$tests\`"
tour=$(block README.md "## Quick start" 2)
[ -n "$tour" ] || fail "the quick start has no tour (its second sh block)"

[ ! -e .wasq ] || fail "$root/.wasq exists (your own \`wasq dev\`?): this check runs the quick start in the repository's folder as written; move it away first"
if (exec 3<>/dev/tcp/127.0.0.1/7070) 2>/dev/null; then
  fail "127.0.0.1:7070 is taken: the quick start's \`wasq dev\` needs it"
fi

# 2. `cargo run -p wasq -- dev` in its own session (cargo and wasq), stopped as Ctrl-C would.
log=$(mktemp)
out=$(mktemp)
dev=
stop() {
  if [ -n "$dev" ]; then
    kill -INT -- "-$dev" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$dev" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$dev" 2>/dev/null || true
    wait "$dev" 2>/dev/null || true
  fi
  rm -rf "$root/.wasq" "$log" "$out"
}
trap stop EXIT
began=$(date +%s)
setsid bash -c "exec $start" </dev/null >"$log" 2>&1 &
dev=$!
until (exec 3<>/dev/tcp/127.0.0.1/7070) 2>/dev/null && [ -s .wasq/dev.key ]; do
  if ! kill -0 "$dev" 2>/dev/null; then
    cat "$log" >&2
    fail "\`$start\` ended before it served"
  fi
  [ $(( $(date +%s) - began )) -lt 2400 ] || { tail -n 20 "$log" >&2; fail "\`$start\` did not serve within 40 minutes"; }
  sleep 0.5
done
echo "readme: \`$start\` built and served after $(( $(date +%s) - began )) s"

# Every "# prints X" comment of block $1 holds: X is in what the block printed ($out), but
# for white space (JSON is printed indented).
check_prints() {
  local line said printed
  printed=$(tr -d '[:space:]' <"$out")
  while IFS= read -r line; do
    case "$line" in
      *"# prints "*)
        said=${line#*# prints }
        grep -qF -- "$(tr -d '[:space:]' <<<"$said")" <<<"$printed" \
          || { cat "$out" >&2; fail "\`$(command_of "$line")\` should print $said"; }
        ;;
    esac
  done <<<"$1"
}

# 3. The tour, in a second shell in the repository's folder: every command succeeds and
# prints what its "# prints" comment says.
( bash -c "set -euo pipefail
$tour" ) >"$out" 2>&1 || { cat "$out" >&2; fail "the quick start's tour failed (above)"; }
check_prints "$tour"
grep -q succeeded "$out" || { cat "$out" >&2; fail "\`wasq runs list\` in the tour shows no succeeded run"; }
echo "readme: the quick start's tour: $(grep -c . <<<"$tour") commands, each as written"

# 4. The Rust examples: the one build block, then each example's deploy and run, in one
# shell (the build block's `cd` holds for the rest).
examples=guest-examples/rust/README.md
script="export PATH=\"\$PWD/target/debug:\$PATH\"
export WASQ_KEY=\$(cat .wasq/dev.key)
$(block "$examples" "# Rust example jobs" 1)"
count=0
while IFS= read -r heading; do
  code=$(block "$examples" "$heading" 1)
  [ "$heading" = "## A job of your own" ] && continue
  count=$((count + 1))
  [ -z "$(block "$examples" "$heading" 2)" ] || fail "$examples: $heading has more than one sh block"
  [ "$(grep -c '^wasq deploy ' <<<"$code")" = 1 ] && [ "$(grep -c '^wasq run ' <<<"$code")" = 1 ] \
    || fail "$examples: $heading needs one \`wasq deploy\` and one \`wasq run\` line"
  grep -q '# prints ' <<<"$code" || fail "$examples: $heading says nowhere (\`# prints ...\`) what it prints"
  script+=$'\n'"$code"
done < <(grep '^## ' "$examples")
[ "$count" = 4 ] || fail "$examples has $count examples, not 4"
( bash -c "set -euo pipefail
$script" ) >"$out" 2>&1 || { cat "$out" >&2; fail "the Rust examples' README failed (above)"; }
check_prints "$script"
# What the README says the event does to the waiting onboarding run.
for _ in $(seq 100); do
  runs=$(target/debug/wasq runs list --function onboarding --output json)
  grep -q '"activated"' <<<"$runs" && grep -q '"succeeded"' <<<"$runs" && break
  sleep 0.2
done
grep -q '"activated"' <<<"$runs" || fail "the onboarding example's run did not end activated: $runs"
echo "readme: the Rust examples' README: $count examples deployed and run as written"
