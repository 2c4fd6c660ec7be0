#!/bin/bash
# Slurm Epilog for stepwatch: runs as root on each node after the job ends. On the job's first
# node it saves the collector's report of the job's whole life (every finding it had, with the
# steps it started and cleared at, efficiency, time breakdown, what-ifs) to
# ${STEPWATCH_REPORT_DIR}/<job>.txt, for programs <job>.json, and <job>.html (one self-contained
# page with the charts, docs/report.md), so that users can read why their job was slow after it
# ended. The collector keeps the report too (`stepwatchctl report JOB`, for
# --report-retention).
# It reads the agent's configuration, the systemd unit's EnvironmentFile
# (/etc/default/stepwatch-agent): the same collectors (STEPWATCH_COLLECTOR, every one: the job may
# be on any 2 of them) and TLS directory (STEPWATCH_TLS_DIR), and STEPWATCH_REPORT_TOKEN_FILE, a
# `reader` token where the collectors want tokens (the agent's own token may only report).
# Variables set in the epilog's environment win over the file.
# It never fails the job: a failing Epilog would drain the node. When no report can be saved it
# logs why (syslog, tag stepwatch, priority user.err, and stderr, which slurmd logs), writes the
# reason to <job>.error in the report directory, and exits 0.
set -u

# The unit's defaults (deploy/systemd/stepwatch-agent.service, Environment=).
collector="stepwatch-collector:7070"
tls_dir="/etc/stepwatch/tls"
token_file=""
report_dir="/var/log/stepwatch"
# Seconds to wait for the collector to see the job's processes exit (its agents notice within one
# --interval), so that the saved report is the final one.
wait_s=15
env_file="${STEPWATCH_AGENT_ENV_FILE:-/etc/default/stepwatch-agent}"
if [ -r "$env_file" ]; then
  # KEY=VALUE lines as systemd reads them (optionally quoted); not sourced: only these keys count.
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
    '#'* | '') continue ;;
    esac
    key="${line%%=*}"
    value="${line#*=}"
    case "$value" in
    \"*\") value="${value:1:${#value}-2}" ;;
    \'*\') value="${value:1:${#value}-2}" ;;
    esac
    case "$key" in
    STEPWATCH_COLLECTOR) collector="$value" ;;
    STEPWATCH_TLS_DIR) tls_dir="$value" ;;
    STEPWATCH_REPORT_TOKEN_FILE) token_file="$value" ;;
    STEPWATCH_REPORT_DIR) report_dir="$value" ;;
    STEPWATCH_REPORT_WAIT) wait_s="$value" ;;
    esac
  done <"$env_file"
fi
collector="${STEPWATCH_COLLECTOR:-$collector}"
tls_dir="${STEPWATCH_TLS_DIR:-$tls_dir}"
token_file="${STEPWATCH_REPORT_TOKEN_FILE:-${STEPWATCH_AUTH_TOKEN_FILE:-$token_file}}"
report_dir="${STEPWATCH_REPORT_DIR:-$report_dir}"
wait_s="${STEPWATCH_REPORT_WAIT:-$wait_s}"
ctl="${STEPWATCHCTL:-/usr/local/bin/stepwatchctl}"

# Logs to syslog and stderr.
log() { # log PRIORITY MESSAGE
  echo "stepwatch epilog: $2" >&2
  logger -t stepwatch -p "user.$1" -- "epilog: $2" 2>/dev/null || true
}

# The collector requires mutual TLS (docs/security.md): use the CA and this node's certificate
# that the agent's systemd unit uses (%H.pem: the host name), and a reader token where the
# collector also wants tokens.
ctl_args=(--collector="$collector")
if [ -r "${tls_dir}/ca.pem" ]; then
  ctl_args+=(--tls-ca="${tls_dir}/ca.pem")
  node_cert="${tls_dir}/$(hostname)"
  if [ -r "${node_cert}.pem" ]; then
    ctl_args+=(--tls-cert="${node_cert}.pem" --tls-key="${node_cert}.key")
  fi
fi
if [ -n "$token_file" ]; then
  ctl_args+=(--auth-token-file="$token_file")
fi

first_node="$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | head -n 1)"
if [ -z "$first_node" ] || [ "$first_node" != "$(hostname -s)" ]; then
  exit 0
fi

# The same default id as task-prolog.sh (the Epilog does not see the job's own environment, so a
# job that chose its own STEPWATCH_JOB runs `stepwatchctl report` itself).
if [ -n "${STEPWATCH_JOB:-}" ]; then
  job="${STEPWATCH_JOB}"
else
  if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    id="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  else
    id="${SLURM_JOB_ID:-unknown}"
  fi
  job="$(printf '%s-%s' "${SLURM_JOB_NAME:-slurm}" "$id" | tr -c 'A-Za-z0-9._:-' '_')"
fi

# For the logs: a user's job id may hold control characters (a forged log line).
shown="$(printf '%s' "$job" | tr -c '[:print:]' '?')"
if ! mkdir -p "$report_dir" 2>/dev/null; then
  log err "no report saved for job ${shown}: cannot create ${report_dir}"
  exit 0
fi
# A user's own STEPWATCH_JOB may hold any character: keep the file names to safe ones.
file="${report_dir}/$(printf '%s' "$job" | tr -c 'A-Za-z0-9._:-' '_')"
json="${file}.json"
# Says why there is no report, in the logs and next to where it would be; exits 0.
fail() {
  rm -f "$json" "${file}.txt" "${file}.html"
  log err "no report saved for job ${shown} (collectors ${collector}): $1"
  printf 'stepwatch epilog: no report saved for job %s (collectors %s): %s\n' "$shown" \
    "$collector" "$1" >"${file}.error" 2>/dev/null || true
  exit 0
}
deadline=$((SECONDS + wait_s))
error=""
while :; do
  if error="$(timeout 10 "$ctl" "${ctl_args[@]}" report "$job" --json 2>&1 >"$json")"; then
    error=""
    if grep -q '"state": "finished"' "$json"; then
      break
    fi
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    break
  fi
  sleep 1
done
if [ -n "$error" ] || [ ! -s "$json" ]; then
  fail "$(printf '%s' "${error:-empty answer}" | head -n 1 | cut -c1-400)"
fi
if ! error="$(timeout 10 "$ctl" "${ctl_args[@]}" report "$job" 2>&1 >"${file}.txt")"; then
  fail "$(printf '%s' "$error" | head -n 1 | cut -c1-400)"
fi
# The page (written to a temporary file and renamed: a reader never sees half of it). Without it
# the text and JSON reports still stand: say why and go on.
if ! error="$(timeout 10 "$ctl" "${ctl_args[@]}" report "$job" --html --output="${file}.html" 2>&1)"; then
  rm -f "${file}.html"
  log warning "no HTML report saved for job ${shown}: $(printf '%s' "$error" | head -n 1 | cut -c1-400)"
fi
rm -f "${file}.error"
saved="${file}.txt and .json"
if [ -s "${file}.html" ]; then
  saved="${file}.txt, .json and .html"
fi
if grep -q '"state": "finished"' "$json"; then
  log info "saved the report of job ${shown} to ${saved}"
else
  log warning "saved the report of job ${shown} to ${saved} before the collectors saw it end (STEPWATCH_REPORT_WAIT=${wait_s})"
fi
exit 0
