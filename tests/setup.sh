#!/usr/bin/env bash
# Installs what the test suite needs beyond Rust, each only when missing (the README's test
# command runs it first; so does CI, on a fresh machine). Tests themselves use no network:
# everything they build from npm, PyPI or crates.io is fetched here.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "$@"
  else sudo apt-get update -qq && sudo apt-get install -y -qq "$@"; fi
}

# Rust guests compile to wasm32-wasip2 (rust-toolchain.toml names it, but rustup does not
# add a target to a toolchain that is already installed).
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi
# The crates the tests' Rust guests build with (a new task of `wasq init --lang rust`, the
# examples, the test guests), so that they build offline.
for m in sdk/rust guest-examples/rust tests/guests; do
  cargo fetch --quiet --manifest-path "$m/Cargo.toml"
done

# The Redis backend's tests start their own redis-server processes (never the machine's
# default one) and use redis-cli to form a Cluster; C tasks build with clang + wasi-libc.
need=()
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || need+=(redis-server)
command -v clang >/dev/null || need+=(clang)
command -v wasm-ld >/dev/null || need+=(lld)
[ -e /usr/share/wasi-sysroot ] || need+=(wasi-libc)
# The dashboard's browser tests (tests/tests/dashboard.rs) drive Debian's chromium.
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
# clang links wasm32 code against compiler-rt's builtins, which clang does not pull in.
ls /usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1 \
  || need+=(libclang-rt-dev-wasm32)
if [ ${#need[@]} -gt 0 ]; then apt_install "${need[@]}"; fi

# Python tasks: componentize-py, pinned as sdk/python's README says.
if ! componentize-py --version 2>/dev/null | grep -q '0.25.1'; then
  python3 -m pip install --quiet componentize-py==0.25.1
fi
# The OpenAPI document's validator (tests/tests/openapi.rs), pinned.
if ! python3 -m openapi_spec_validator --version 2>/dev/null | grep -q '0.9.0'; then
  python3 -m pip install --quiet openapi-spec-validator==0.9.0
fi

# JavaScript tasks: componentize-js (pinned in every package.json) into tests/lang/js, which
# also fills npm's cache, so that `npm install --offline` in a new task folder and in
# guest-examples/js (what the tests do) finds every package without the network.
if [ ! -x tests/lang/js/node_modules/.bin/componentize-js ]; then
  npm install --prefix tests/lang/js --no-audit --no-fund --no-package-lock --silent
fi
