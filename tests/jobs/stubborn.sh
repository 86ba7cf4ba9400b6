#!/usr/bin/env bash
# A job that ignores the interrupt protocol and SIGTERM: only SIGKILL stops it.
trap '' TERM
echo "stubborn job $HFAI_JOB_ID run $HFAI_RUN_ID"
while true; do sleep 0.1; done
