#!/bin/sh
# Regenerates the vendored C bindings in src/ (task_world.c, task_world.h,
# task_world_component_type.o) from the repository's wit/ folder. For maintainers only:
# users build with clang alone. Run after any change to wit/ and commit the result.
#
# Needs wit-bindgen-cli 0.63.0 (the version the Rust SDK's wit-bindgen crate pins):
#   cargo install wit-bindgen-cli --version 0.63.0 --locked
# The world is renamed to `task_world` so the generated task_world.c cannot clash with the
# user's task.c in the folder `wasq init --lang c` writes.
set -eu
cd "$(dirname "$0")"
WIT_BINDGEN=${WIT_BINDGEN:-wit-bindgen}
"$WIT_BINDGEN" --version | grep -q ' 0\.63\.0' ||
  echo "warning: expected wit-bindgen 0.63.0, got: $("$WIT_BINDGEN" --version)" >&2
"$WIT_BINDGEN" c ../../wit --world task --rename-world task_world --out-dir src
