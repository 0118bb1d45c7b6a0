#!/usr/bin/env bash
# The nightly histories' durable copy: the branch `nightly-history` of the repository, one commit a night holding
# every history file under history/ (no artifact retention expires it, and its log is the record of every night).
#
#   bash scripts/nightly_history.sh fetch NAME...   history/NAME.json from the branch, for each NAME. Fails, saying
#                                                   why, when the branch or a file cannot be had: the old nights and any
#                                                   open slowdown are in it, and a night that started a new history
#                                                   would lose them unseen. NEW_HISTORY=1 starts the missing ones
#                                                   instead, on purpose (the first night, or after a deliberate reset).
#   bash scripts/nightly_history.sh store NAME...   commits history/NAME.json onto the branch and pushes it (the
#                                                   branch is created on first use; a race with another job is retried)
#
# HISTORY_REMOTE (default origin) and HISTORY_BRANCH (default nightly-history) name where the copy lives.
set -euo pipefail
remote=${HISTORY_REMOTE:-origin}
branch=${HISTORY_BRANCH:-nightly-history}
action=${1:?usage: nightly_history.sh fetch|store NAME...}
shift
[ $# -gt 0 ] || { echo "usage: nightly_history.sh fetch|store NAME..." >&2; exit 2; }
mkdir -p history

fail() {
  echo "::error::$1" >&2
  exit 1
}

case "$action" in
  fetch)
    if ! why=$(git fetch --quiet "$remote" "refs/heads/$branch" 2>&1); then
      if [ "${NEW_HISTORY:-0}" = 1 ]; then
        echo "no branch $branch on $remote: new histories start tonight (NEW_HISTORY=1)"
        for name in "$@"; do rm -f "history/$name.json"; done
        exit 0
      fi
      fail "cannot fetch the histories' branch $branch from $remote (${why//$'\n'/ }). The earlier nights and any open slowdown are on that branch; this night is not judged without them. Rerun once it can be fetched, or start new histories on purpose with NEW_HISTORY=1 (the workflow's new_history input)."
    fi
    tip=$(git rev-parse --short FETCH_HEAD)
    for name in "$@"; do
      if git cat-file -e "FETCH_HEAD:history/$name.json" 2>/dev/null; then
        git show "FETCH_HEAD:history/$name.json" > "history/$name.json"
        echo "history/$name.json: from $branch at $tip"
      elif [ "${NEW_HISTORY:-0}" = 1 ]; then
        rm -f "history/$name.json"
        echo "history/$name.json: not on $branch; a new one starts tonight (NEW_HISTORY=1)"
      else
        fail "$branch (at $tip) has no history/$name.json: tonight would start a new history and lose sight of the old nights. Restore it from the branch's log (git log $branch -- history/$name.json) or start it on purpose with NEW_HISTORY=1."
      fi
    done
    ;;
  store)
    export GIT_AUTHOR_NAME=${GIT_AUTHOR_NAME:-fastpath nightly} GIT_AUTHOR_EMAIL=${GIT_AUTHOR_EMAIL:-nightly@localhost}
    export GIT_COMMITTER_NAME=${GIT_COMMITTER_NAME:-$GIT_AUTHOR_NAME} GIT_COMMITTER_EMAIL=${GIT_COMMITTER_EMAIL:-$GIT_AUTHOR_EMAIL}
    for name in "$@"; do [ -f "history/$name.json" ] || fail "no history/$name.json to store"; done
    index=$(mktemp)
    trap 'rm -f "$index"' EXIT
    for attempt in 1 2 3 4 5; do
      parent=""
      if git fetch --quiet "$remote" "refs/heads/$branch" 2>/dev/null; then parent=$(git rev-parse FETCH_HEAD); fi
      rm -f "$index"
      if [ -n "$parent" ]; then GIT_INDEX_FILE=$index git read-tree "$parent"; fi
      for name in "$@"; do
        blob=$(git hash-object -w "history/$name.json")
        GIT_INDEX_FILE=$index git update-index --add --cacheinfo "100644,$blob,history/$name.json"
      done
      tree=$(GIT_INDEX_FILE=$index git write-tree)
      if [ -n "$parent" ] && [ "$tree" = "$(git rev-parse "$parent^{tree}")" ]; then
        echo "histories unchanged on $branch"; exit 0
      fi
      commit=$(git commit-tree "$tree" ${parent:+-p "$parent"} -m "nightly histories: $(date -u +%Y-%m-%dT%H:%M:%SZ) ${GITHUB_SHA:-}")
      if git push --quiet "$remote" "$commit:refs/heads/$branch" 2>/dev/null; then
        echo "stored $* on $branch ($(git rev-parse --short "$commit"))"
        exit 0
      fi
      sleep $((attempt * 3))  # another job pushed meanwhile: take its commit as the parent and try again
    done
    fail "could not push the histories to $branch on $remote after 5 attempts; they are kept in this run's artifact"
    ;;
  *)
    echo "usage: nightly_history.sh fetch|store NAME..." >&2
    exit 2
    ;;
esac
