#!/usr/bin/env bash
# Runs a long command and says it is still alive: every N seconds (default 30, PROGRESS_EVERY_S) a line
#   <label>: still running after 4m30s[; last: <last line of its log>]
# on stderr, so a cold Go build, apt or pip never sits silent for minutes. A command that ends before
# the first beat prints nothing of ours; one that beat at least once ends with "<label>: done in …".
# The command's exit status is passed through (124 from `timeout` too).
# It needs only bash itself: time comes from $SECONDS, and on a PATH without `sleep` (a test's bare PATH,
# a minimal image) the command runs without the heartbeat instead of the beat spinning.
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
elapsed() { local s=$SECONDS; if (( s >= 60 )); then echo "$((s / 60))m$((s % 60))s"; else echo "${s}s"; fi; }

if [[ -n "$log" ]]; then
  [[ "$log" != */* || -d "${log%/*}" ]] || mkdir -p "${log%/*}" || exit 2
  exec 3>>"$log"
fi
if ! command -v sleep >/dev/null; then
  if [[ -n "$log" ]]; then exec "$@" >&3 2>&3 3>&-; else exec "$@"; fi
fi
if [[ -n "$log" ]]; then "$@" >&3 2>&3 3>&- & else "$@" & fi
pid=$!
# A signal to us stops the command too (make's Ctrl-C, timeout's TERM).
trap 'kill -TERM "$pid" 2>/dev/null' TERM INT HUP

(
  # The sleep runs in the background so a TERM from us ends it at once: a leftover sleep would hold the
  # caller's pipes open until it ended.
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$every" & nap=$!
    wait "$nap"
    line="$label: still running after $(elapsed)"
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
kill "$beater" 2>/dev/null; wait "$beater" 2>/dev/null
# A command that outlived one interval has beaten at least once: close its heartbeat with the outcome.
if (( SECONDS >= every )); then
  if (( rc == 0 )); then echo "$label: done in $(elapsed)" >&2; else echo "$label: failed (exit $rc) after $(elapsed)" >&2; fi
fi
exit "$rc"
