#!/bin/bash
# Slurm Epilog for stepwatch: runs as root on each node after the job ends. On the job's first
# node it saves the collector's diagnosis of the job (time breakdown, stragglers, findings) to
# ${STEPWATCH_REPORT_DIR}/<job>.txt so that users can read why their job was slow after it ended.
# It never fails: a missing collector only means no report.
set -u

report_dir="${STEPWATCH_REPORT_DIR:-/var/log/stepwatch}"
collector="${STEPWATCH_COLLECTOR:-stepwatch-collector:7070}"
ctl="${STEPWATCHCTL:-/usr/local/bin/stepwatchctl}"

first_node="$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | head -n 1)"
if [ -z "$first_node" ] || [ "$first_node" != "$(hostname -s)" ]; then
  exit 0
fi

# The same default id as task-prolog.sh (the Epilog does not see the job's own environment, so a
# job that chose its own STEPWATCH_JOB runs `stepwatchctl explain` itself).
job="${STEPWATCH_JOB:-$(printf '%s-%s' "${SLURM_JOB_NAME:-slurm}" "${SLURM_JOB_ID:-unknown}" | tr -c 'A-Za-z0-9._:-' '_')}"

mkdir -p "$report_dir" 2>/dev/null || exit 0
timeout 10 "$ctl" --collector="$collector" explain "$job" >"${report_dir}/${job}.txt" 2>&1 ||
  logger -t stepwatch "epilog: no stepwatch report for job ${job}"
exit 0
