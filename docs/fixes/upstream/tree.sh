#!/bin/sh
# Make DEST a git tree of hermes-agent 0.19.0's source (its PyPI sdist, committed and tagged v0.19.0) and apply the
# upstream form of the fix series to it with `git am`, one commit per fix (docs/fixes/README.md).
#
#   docs/fixes/upstream/tree.sh DEST [SDIST]
#
# SDIST: hermes_agent-0.19.0.tar.gz (default: downloaded with
# `python3 -m pip download --no-deps --no-binary :all: hermes-agent==0.19.0`).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: tree.sh DEST [SDIST]}
sdist=${2:-}
if [ -z "$sdist" ]; then
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --no-binary :all: hermes-agent==0.19.0 -d "$tmp"
    sdist=$tmp/hermes_agent-0.19.0.tar.gz
fi
[ ! -e "$dest" ] || [ -z "$(ls -A "$dest")" ] || { echo "tree.sh: $dest is not empty" >&2; exit 2; }
mkdir -p "$dest"
tar -xzf "$sdist" -C "$dest" --strip-components=1
cd "$dest"
who="-c user.name=tenancy-audit -c user.email=tenancy-audit@users.noreply.invalid"
git init -q
git add -A
git $who commit -qm "hermes-agent 0.19.0 (sdist)"
git tag v0.19.0
git $who am -q "$here"/*.patch
git log --oneline v0.19.0..HEAD | wc -l | xargs printf "tree.sh: %s fixes applied on v0.19.0 in $dest\n"
