#!/bin/bash
# clusterx job {{job_id}}, attempt {{attempt}}: rendered by clusterx, submitted with sbatch --parsable.
# Rendered from clusterx/backends/slurm/sbatch.template.sh: each placeholder (a name in double braces) is replaced
# by a value already quoted for bash (script.py); the directives, environment and launch ones by whole lines.
{{directives}}

# --export=NONE keeps the submitting shell out, but Slurm still loads the user's login environment on the
# node: drop every variable but Slurm's own, so the job sees exactly the spec's environment.
for __cx_var in $(compgen -e); do
  case "$__cx_var" in SLURM_* | SLURMD_*) ;; *) unset "$__cx_var" 2>/dev/null ;; esac
done
unset __cx_var
PATH=/usr/local/bin:/usr/bin:/bin  # not exported: finds this script's helpers unless the job sets PATH

# Exit-code file: how clusterx learns how the job ended on a cluster without slurmdbd or completion log.
__cx_status_file={{state_dir}}/"$SLURM_JOB_ID".status
printf -v __cx_start '%(%s)T' -1  # bash's own clock: no process to start
__cx_record() {  # rewrite the whole file and rename it into place: a reader never sees half of it
  printf '%s\n' "start=$__cx_start" "time_limit_s={{time_limit_s}}" "procs_per_node={{procs_per_node}}" \
    "restarts=${SLURM_RESTART_COUNT:-0}" "nodelist=$SLURM_JOB_NODELIST" "$@" >"$__cx_status_file.tmp" &&
    mv -f -- "$__cx_status_file.tmp" "$__cx_status_file"
}
mkdir -p -- {{state_dir}} && __cx_record
__cx_child=
# Slurm's state and reason as the script ends: COMPLETING|TimeLimit on a time-out, COMPLETING|None on scancel
# (Slurm marks the job before it signals it); RUNNING when the job ended by itself.
__cx_slurm_view() {
  timeout 20 {{squeue}} --noheader --states=all --format='%T|%r' --jobs="$SLURM_JOB_ID" 2>/dev/null
}
# Slurm sends SIGTERM on scancel and at the time limit (SIGKILL follows KillWait seconds later): record it, pass
# it on to the processes, wait for them. Each end is written twice: at once, then with Slurm's view, so a SIGKILL
# arriving while squeue answers still leaves the end recorded.
__cx_on_term() {
  printf -v __cx_end '%(%s)T' -1
  __cx_record "signal=TERM" "end=$__cx_end"
  __cx_record "signal=TERM" "slurm=$(__cx_slurm_view)" "end=$__cx_end"
  [ -n "$__cx_child" ] && kill -TERM "$__cx_child" 2>/dev/null
  wait
  exit 143
}
trap __cx_on_term TERM

# The job's environment (clusterx.jobenv: the spec's variables and the CLUSTERX_* ones).
{{environment}}
# A job Slurm requeued (--requeue) runs this script again: each run is the next attempt, as a local retry is.
export CLUSTERX_ATTEMPT=$((CLUSTERX_ATTEMPT + ${SLURM_RESTART_COUNT:-0}))
# srun would inherit --export=NONE from sbatch (through SLURM_EXPORT_ENV): its tasks must see the above.
export SLURM_EXPORT_ENV=ALL
mkdir -p -- "$CLUSTERX_RUN_DIR"

# Rendezvous: the first host of the allocation, a port derived from the job id.
MASTER_ADDR=$({{scontrol}} show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=$(({{rdzv_port_base}} + SLURM_JOB_ID % {{rdzv_port_span}}))
export MASTER_ADDR MASTER_PORT

# Launch: the job's processes run in the background so that the TERM trap above runs at once.
{{launch}} &
__cx_child=$!
wait "$__cx_child"
__cx_rc=$?
printf -v __cx_end '%(%s)T' -1
__cx_record "exit=$__cx_rc" "end=$__cx_end"
__cx_record "exit=$__cx_rc" "slurm=$(__cx_slurm_view)" "end=$__cx_end"
exit "$__cx_rc"
