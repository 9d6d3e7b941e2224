#!/usr/bin/env bash
# Copies the WASI 0.2 WIT that the pinned wasmtime-wasi and wasmtime-wasi-http ship into
# wit/deps, so guests and host compile against exactly the interfaces the host links. Run
# after bumping wasmtime; the test `vendored_wasi_wit_matches_wasmtime` (host/sandbox) fails
# until you do.
set -euo pipefail
cd "$(dirname "$0")/.."
dirs=$(cargo metadata --format-version 1 --locked |
  python3 -c '
import json, sys, os
m = json.load(sys.stdin)
d = {p["name"]: os.path.dirname(p["manifest_path"]) for p in m["packages"]}
print(d["wasmtime-wasi"], d["wasmtime-wasi-http"])')
read -r wasi http <<<"$dirs"
rm -rf wit/deps && mkdir -p wit/deps
for f in cli clocks filesystem io random sockets; do
  cp "$wasi/src/p2/wit/deps/$f.wit" "wit/deps/$f.wit"
done
cp "$http/wit/deps/http.wit" wit/deps/http.wit
echo "vendored WASI WIT from $wasi and $http"
