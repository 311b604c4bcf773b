#!/usr/bin/env bash
# On a lent GPU machine with no package index (the H200 here): install the wheels carried in .whl/
# (whatever that image lacks) into /tmp/site, then this project, editable and
# without dependencies. Use after TE is installed; then: PYTHONPATH=/tmp/site python3 -m pytest tests/te -q
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
python3 -m pip install -q --no-deps --no-build-isolation -e .
echo "installed; run with PYTHONPATH=/tmp/site"
