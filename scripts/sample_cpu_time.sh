#!/usr/bin/env bash
# Sample the CPU time of running training processes every 20 s, for runs that do not log cpu_hours themselves:
#   scripts/sample_cpu_time.sh >> runs/cpu_samples.txt &
# Each line: unix time, the run's output folder name, utime + stime in seconds (from /proc/PID/stat).
# scripts/plot_training_compute.py --cpu-samples reads the file.
set -euo pipefail
TCK=$(getconf CLK_TCK)
while true; do
  for pid in $(pgrep -f "hf_dspark.training --data" || true); do
    name=$(tr '\0' ' ' < "/proc/$pid/cmdline" | grep -o "output_dir [^ ]*" | awk -F/ '{print $NF}')
    read -r ut st <<< "$(awk '{print $14, $15}' "/proc/$pid/stat")"
    echo "$(date +%s) $name $(( (ut + st) / TCK ))"
  done
  sleep 20
done
