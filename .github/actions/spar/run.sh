#!/usr/bin/env bash
# The steps of Spar's GitHub Action (action.yml, at the repository's root, runs this once
# it has installed the client): push the scenarios, run the batch, append its Markdown
# summary to the job summary, set the step's outputs, and exit with spar batch run's code
# (0 passed, 1 failed or a significant regression, 2 an error, 3 usage or connection).
#
# Its inputs are environment variables, as action.yml maps them: SPAR_URL, SPAR_TOKEN and
# SPAR_ORG (read by spar itself: the token is never an argument, never printed), and
# SPAR_ACTION_<INPUT>.  GITHUB_STEP_SUMMARY and GITHUB_OUTPUT are the runner's files;
# without them (run by hand) the summary and outputs are only left in the work directory.
# tests/e2e/test_cli.py runs this very script against a local Spar.
set -euo pipefail

: "${SPAR_URL:?the url input is empty}"
: "${SPAR_TOKEN:?the token input is empty}"
: "${SPAR_ACTION_AGENT:?the agent input is empty}"
: "${SPAR_ACTION_TAGS:?the tags input is empty}"

work="$(mktemp -d "${RUNNER_TEMP:-${TMPDIR:-/tmp}}/spar.XXXXXX")"
summary="$work/summary.md"
report="$work/batch.json"

code=0
if [ -n "${SPAR_ACTION_SCENARIOS:-}" ]; then
  spar scenarios push "$SPAR_ACTION_SCENARIOS" || code=$?
fi

if [ "$code" -eq 0 ]; then
  args=(batch run --agent "$SPAR_ACTION_AGENT" --repetitions "${SPAR_ACTION_REPETITIONS:-1}"
    --summary "$summary" --json "$report")
  # Tags may hold spaces: one per line or between commas.
  while IFS= read -r tag; do
    tag="$(printf '%s' "$tag" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')"
    if [ -n "$tag" ]; then
      args+=(--tag "$tag")
    fi
  done < <(printf '%s\n' "$SPAR_ACTION_TAGS" | tr ',' '\n')
  if [ -n "${SPAR_ACTION_BASELINE:-}" ]; then
    args+=(--baseline "$SPAR_ACTION_BASELINE")
  fi
  if [ -n "${SPAR_ACTION_FAIL_UNDER:-}" ]; then
    args+=(--fail-under "$SPAR_ACTION_FAIL_UNDER")
  fi
  if [ -n "${SPAR_ACTION_JUNIT:-}" ]; then
    args+=(--junit "$SPAR_ACTION_JUNIT")
  fi
  spar "${args[@]}" || code=$?
fi

if [ -s "$summary" ] && [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  { echo; cat "$summary"; } >>"$GITHUB_STEP_SUMMARY"  # after whatever the step wrote
fi
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  {
    echo "exit-code=$code"
    if [ -s "$summary" ]; then
      echo "summary-file=$summary"
    fi
    if [ -s "$report" ]; then
      # The batch's id and the share of its runs that passed, from the JSON report.
      python - "$report" <<'PYTHON'
import json
import sys

with open(sys.argv[1], encoding="utf-8") as file:
    batch = json.load(file)["batch"]
total = batch["total_scenarios"]
print(f"batch-id={batch['id']}")
print(f"pass-rate={round(batch['passed_scenarios'] / total, 4) if total else 0.0}")
PYTHON
    fi
  } >>"$GITHUB_OUTPUT"
fi
exit "$code"
