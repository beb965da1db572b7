#!/usr/bin/env bash
# Creates the pinned Python environments the end-to-end tests run
# (tests/lib.rs: python(), python_mcp1()), at the repository root:
#   .venv-tests/       tests/requirements.txt       openai, anthropic, mcp 2.x
#   .venv-tests-mcp1/  tests/requirements-mcp1.txt  mcp 1.26.0, for one test
# An environment is made again only when its requirements file or the
# Python it was made from changed, so running this again is quick.
# README ("Run the tests") and .ci/run call it. Python from $PYTHON3, else
# python3; a Debian python3 needs the python3-venv package.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON3:-python3}

if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
  echo "$py cannot create a virtual environment: install python3-venv (Debian: apt-get install python3-venv)" >&2
  exit 1
fi

# make_env DIR REQUIREMENTS: DIR holds exactly REQUIREMENTS.
make_env() {
  local dir=$1 req=$2 want
  want=$({ "$py" -c 'import sys; print(sys.executable, sys.version)'; cat "$req"; } | sha256sum | cut -d' ' -f1)
  if [[ -x $dir/bin/python && -f $dir/.requirements.sha256 && $(cat "$dir/.requirements.sha256") == "$want" ]]; then
    return
  fi
  rm -rf "$dir"
  "$py" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req"
  echo "$want" > "$dir/.requirements.sha256"
  echo "$dir: $(wc -l < <(grep -v '^#' "$req")) packages from $req"
}

make_env .venv-tests tests/requirements.txt
make_env .venv-tests-mcp1 tests/requirements-mcp1.txt
