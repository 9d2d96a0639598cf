#!/usr/bin/env bash
# Regenerate requirements-lock.txt: every package, direct and transitive, that the README's install brings into a
# fresh venv, at the version it brought (the set CI tests). Needs the package index; takes a few minutes.
#   bash scripts/lock_requirements.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
python -m venv "$venv"
DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q torch==2.13.0 -r requirements.txt
{
    echo "# Every package the README's install brings into a fresh venv, pinned (regenerate: bash scripts/lock_requirements.sh)."
    echo "# Used as constraints (pip install ... -c requirements-lock.txt): requirements.txt keeps the ranges."
    "$venv/bin/python" -m pip freeze --all --exclude pip --exclude setuptools --exclude wheel
} > requirements-lock.txt
rm -rf "$(dirname "$venv")"
echo "wrote requirements-lock.txt ($(grep -vc '^#' requirements-lock.txt) packages)"
