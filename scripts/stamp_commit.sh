#!/usr/bin/env bash
# Record the commit of this checkout in .device-commit (and whether tracked files differ from it),
# before copying the tree to a GPU machine without .git: every results record written there then
# carries this commit (scripts/device_setup.sh points harness.run.env at the file).
#
#   bash scripts/stamp_commit.sh            # then copy .device-commit along with the tree
set -euo pipefail
cd "$(dirname "$0")/.."
state=clean
[ -n "$(git status --porcelain --untracked-files=no)" ] && state=dirty
echo "$(git rev-parse HEAD) $state" > .device-commit
cat .device-commit
