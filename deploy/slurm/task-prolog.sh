#!/bin/bash
# Slurm TaskProlog for stepwatch: runs as the job's user before each task; every line it prints
# as `export NAME=value` is set in the task's environment. It gives every rank of the job the same
# STEPWATCH_JOB and the node agent's socket.
#
# The job id defaults to <job name>-<job id> (unique per run). Runs that should be compared with
# each other (scaling efficiency is tracked per STEPWATCH_JOB across world sizes) can set their own:
#   sbatch --export=ALL,STEPWATCH_JOB=llama-7b-pretrain train.sbatch
# A value already in the environment is kept.
set -u

socket="${STEPWATCH_SOCKET:-/run/stepwatch/agent.sock}"

if [ -n "${STEPWATCH_JOB:-}" ]; then
  job="${STEPWATCH_JOB}"
else
  if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    id="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  else
    id="${SLURM_JOB_ID:-unknown}"
  fi
  name="${SLURM_JOB_NAME:-slurm}"
  # Keep the id to characters that are safe in a Prometheus label and a shell word.
  job="$(printf '%s-%s' "$name" "$id" | tr -c 'A-Za-z0-9._:-' '_')"
fi

echo "export STEPWATCH_JOB=${job}"
echo "export STEPWATCH_SOCKET=${socket}"
exit 0
