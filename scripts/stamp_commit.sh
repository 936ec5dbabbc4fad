#!/usr/bin/env bash
# Before a device run: record the commit being sent (the device's copy of the tree has no .git),
# so every results record there carries it. Carry the file with the run:
#   bash scripts/stamp_commit.sh && device run ... carry=[".whl", ".device-commit"]
set -euo pipefail
cd "$(dirname "$0")/.."
state=clean
[ -n "$(git status --porcelain --untracked-files=no)" ] && state=dirty
echo "$(git rev-parse HEAD) $state" > .device-commit
cat .device-commit
