#!/bin/bash
# Slurm Epilog for stepwatch: runs as root on each node after the job ends. On the job's first
# node it saves the collector's report of the job's whole life (every finding it had, with the
# steps it started and cleared at, efficiency, time breakdown, what-ifs) to
# ${STEPWATCH_REPORT_DIR}/<job>.txt and, for programs, <job>.json, so that users can read why their
# job was slow after it ended. The collector keeps the report too (`stepwatchctl report JOB`, for
# --report-retention). It never fails: a missing collector only means no saved report.
set -u

report_dir="${STEPWATCH_REPORT_DIR:-/var/log/stepwatch}"
collector="${STEPWATCH_COLLECTOR:-stepwatch-collector:7070}"
ctl="${STEPWATCHCTL:-/usr/local/bin/stepwatchctl}"
# Seconds to wait for the collector to see the job's processes exit (its agents notice within one
# --interval), so that the saved report is the final one.
wait_s="${STEPWATCH_REPORT_WAIT:-15}"
# The collector requires mutual TLS (docs/security.md): use the CA and this node's certificate
# that the agent's systemd unit uses, and a reader token where the collector also wants tokens.
tls_dir="${STEPWATCH_TLS_DIR:-/etc/stepwatch/tls}"
ctl_args=(--collector="$collector")
if [ -r "${tls_dir}/ca.pem" ]; then
  ctl_args+=(--tls-ca="${tls_dir}/ca.pem")
  node_cert="${tls_dir}/$(hostname)"
  if [ -r "${node_cert}.pem" ]; then
    ctl_args+=(--tls-cert="${node_cert}.pem" --tls-key="${node_cert}.key")
  fi
fi
if [ -n "${STEPWATCH_AUTH_TOKEN_FILE:-}" ]; then
  ctl_args+=(--auth-token-file="${STEPWATCH_AUTH_TOKEN_FILE}")
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

mkdir -p "$report_dir" 2>/dev/null || exit 0
# A user's own STEPWATCH_JOB may hold any character: keep the file names to safe ones.
file="${report_dir}/$(printf '%s' "$job" | tr -c 'A-Za-z0-9._:-' '_')"
json="${file}.json"
deadline=$((SECONDS + wait_s))
while :; do
  if timeout 10 "$ctl" "${ctl_args[@]}" report "$job" --json >"$json" 2>/dev/null &&
    grep -q '"state": "finished"' "$json"; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    break
  fi
  sleep 1
done
if [ -s "$json" ] && timeout 10 "$ctl" "${ctl_args[@]}" report "$job" \
  >"${file}.txt" 2>&1; then
  exit 0
fi
rm -f "$json"
logger -t stepwatch "epilog: no stepwatch report for job ${job}" 2>/dev/null
exit 0
