#!/usr/bin/env bash
# buf-against.sh prints the buf input that make lint's `buf breaking` compares
# the API with, a git revision of this repository, and says on stderr which
# one and why. It prints nothing when there is no earlier API to compare with
# (the first commit, or a revision without proto/).
#
#   1. BUF_AGAINST, when set, as given (any buf input).
#   2. The last release: the newest tag v<digit>* reachable from HEAD. An
#      API change must stay compatible with what was released.
#   3. Without a release, main:
#      - when HEAD is main's tip (CI's fresh clone of main), or there is no
#        main branch, main's previous commit, HEAD's first parent, so that an
#        incompatible change in the newest commit or merge fails;
#      - otherwise the commit where HEAD left main (their merge base), so
#        that a branch is judged by its own changes, not by main's newer ones.
#
# A revision from before buf.yaml moved to the repository root keeps its
# module in proto/, so it is read with subdir=proto.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n ${BUF_AGAINST:-} ]]; then
	echo "buf breaking: against BUF_AGAINST=$BUF_AGAINST" >&2
	echo "$BUF_AGAINST"
	exit 0
fi

commit() { git rev-parse -q --verify "$1^{commit}" 2>/dev/null; }

main=""
for b in main origin/main; do
	if main=$(commit "$b"); then
		break
	fi
done
head=$(commit HEAD)

if tag=$(git describe --tags --abbrev=0 --match 'v[0-9]*' HEAD 2>/dev/null); then
	rev=$(commit "$tag")
	why="the last release, $tag"
elif [[ -z $main || $head == "$main" ]]; then
	if ! rev=$(commit HEAD^1); then
		if [[ $(git rev-parse --is-shallow-repository) == true ]]; then
			echo "buf breaking: HEAD's parent is missing from this shallow clone; run git fetch --deepen=1" >&2
			exit 1
		fi
		echo "buf breaking: HEAD is the first commit; nothing to compare with" >&2
		exit 0
	fi
	why="main's previous commit (HEAD's first parent)"
else
	if ! rev=$(git merge-base HEAD "$main"); then
		echo "buf breaking: HEAD shares no history with main" >&2
		exit 1
	fi
	why="where HEAD left main"
fi

if git cat-file -e "$rev:buf.yaml" 2>/dev/null; then
	subdir=""
elif git cat-file -e "$rev:proto/buf.yaml" 2>/dev/null; then
	subdir=",subdir=proto"
else
	echo "buf breaking: $why, ${rev:0:12}, has no API; nothing to compare with" >&2
	exit 0
fi
echo "buf breaking: against $why, ${rev:0:12}" >&2
echo ".git#ref=$rev$subdir"
