#!/usr/bin/env bash
# Runs a long command and says it is still alive: every N seconds (default 30, PROGRESS_EVERY_S) a line
#   <label>: still running after 4m30s[; last: <last line of its log>]
# on stderr, so a cold Go build, apt or pip never sits silent for minutes. A command that ends before
# the first beat prints nothing of ours; one that beat at least once ends with "<label>: done in …".
# The command's exit status is passed through (124 from `timeout` too).
# It needs only bash itself: time comes from $SECONDS and the wait between beats is bash's `read -t`, so a
# bare PATH (a test's, a minimal image's) beats like any other.
#
# usage: tools/progress.sh [--every SECONDS] [--log FILE] LABEL -- COMMAND [ARG...]
#   --log FILE  the command's stdout and stderr go to FILE (appended), and each beat quotes its last line
set -uo pipefail

usage() { echo "usage: tools/progress.sh [--every SECONDS] [--log FILE] LABEL -- COMMAND [ARG...]" >&2; exit 2; }

every="${PROGRESS_EVERY_S:-30}"
log=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --every) [[ $# -ge 2 ]] || usage; every="$2"; shift 2 ;;
    --log) [[ $# -ge 2 ]] || usage; log="$2"; shift 2 ;;
    --) usage ;;
    *) break ;;
  esac
done
[[ $# -ge 3 && "$2" == "--" ]] || usage
label="$1"; shift 2
[[ "$every" =~ ^[1-9][0-9]*$ ]] || { echo "tools/progress.sh: --every must be a whole number of seconds >= 1, not '$every'" >&2; exit 2; }

SECONDS=0
# elapsed VAR: VAR gets the time since start as 4m30s (no command substitution: see the beat below).
elapsed() { local s=$SECONDS; if (( s >= 60 )); then printf -v "$1" '%dm%ds' $((s / 60)) $((s % 60)); else printf -v "$1" '%ds' "$s"; fi; }

if [[ -n "$log" ]]; then
  [[ "$log" != */* || -d "${log%/*}" ]] || mkdir -p "${log%/*}" || exit 2
  exec 3>>"$log"
fi
if [[ -n "$log" ]]; then "$@" >&3 2>&3 3>&- & else "$@" & fi
pid=$!
# A signal to us stops the command too (make's Ctrl-C, timeout's TERM).
trap 'kill -TERM "$pid" 2>/dev/null' TERM INT HUP

# The beat waits with bash's own `read -t` on a pipe nobody writes to, so it has no child process (a
# leftover sleep would hold the caller's pipes open) and needs nothing on PATH. It is stopped with KILL,
# never through a trap: bash 5.2 parses `$(...)` when it runs it, and a trap that fires mid-parse fails
# ("unexpected EOF while looking for matching `)'") and leaves the beat running for ever.
(
  exec {nap}<> <(:)
  while :; do
    read -r -t "$every" -u "$nap" _
    elapsed now
    line="$label: still running after $now"
    if [[ -n "$log" && -s "$log" ]] && command -v tail >/dev/null; then
      last="$(tail -n 1 "$log")"; last="${last//$'\r'/}"; last="${last:0:160}"
      [[ -n "$last" ]] && line="$line; last: $last"
    fi
    echo "$line" >&2
  done
) &
beater=$!

wait "$pid"; rc=$?
# `wait` returns early (>128) when a trapped signal arrives; wait again for the command's real status.
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; rc=$?; done
kill -KILL "$beater" 2>/dev/null; wait "$beater" 2>/dev/null
# A command that outlived one interval has beaten at least once: close its heartbeat with the outcome.
if (( SECONDS >= every )); then
  elapsed took
  if (( rc == 0 )); then echo "$label: done in $took" >&2; else echo "$label: failed (exit $rc) after $took" >&2; fi
fi
exit "$rc"
