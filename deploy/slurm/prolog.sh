#!/bin/bash
# Slurm Prolog for stepwatch: runs as root on each allocated node before the job starts and makes
# sure the node's agent is running, so the job's first steps are not lost. It never fails the job:
# stepwatch is an observer, a missing agent must not keep anyone from training.
set -u

if command -v systemctl >/dev/null 2>&1; then
  if ! systemctl is-active --quiet stepwatch-agent.service; then
    systemctl start stepwatch-agent.service ||
      logger -t stepwatch "prolog: could not start stepwatch-agent for job ${SLURM_JOB_ID:-?}"
  fi
fi
exit 0
