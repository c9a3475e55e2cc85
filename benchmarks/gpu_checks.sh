#!/usr/bin/env bash
# Issue 82's GPU checks in one run of at most 10 minutes on one H100/H200; results under $OUT as they come.
#
#     OUT=/tmp/out bash benchmarks/gpu_checks.sh                 # makes a 30-hour synthetic corpus first
#     OUT=/tmp/out HOURS=100 bash benchmarks/gpu_checks.sh       # LibriSpeech-100's size (about 2.5 min more)
#     OUT=/tmp/out CORPUS=/data/c100 bash benchmarks/gpu_checks.sh  # a corpus made before (data.root: holds LibriSpeech/)
#
# Parts, in order of what they tell (each with its own timeout, never past the whole run's deadline, so a
# slow part leaves the others their time; a part cut short says so in $OUT/summary.txt and keeps its log):
#   env          GPU, driver, torch, cuDNN, and SDPA's priority order on this GPU (does torch pick cuDNN?)
#   corpus       benchmarks/gpu_corpus.py (asr.synth_librispeech, Pico for Piper where Piper is not installed;
#                $HOURS hours, 30 by default; only without $CORPUS; needs the [synth] extra), on all CPU cores
#                but two, while
#   shapes       benchmarks/shape_variety.py on the Transformer: first and second meeting of 20 batch shapes,
#                per SDPA backend, unpadded and with --pad-multiple 64 (no corpus needed: the GPU is free)
#   transformer  recipes/librispeech100_transformer.yaml as shipped (data.pad_frames_to 64, sdpa_backend auto)
#                for train.max_minutes=1: s/update from train.log, how far into its epoch (the share of an
#                epoch is the corpus' own; the target is a LibriSpeech-100 epoch in 1.5 minutes), the GPU's
#                busy share sampled each second
#   las          recipes/librispeech100.yaml, a full first epoch (no length curriculum, speller from the first
#                update, as docs/benchmarks.md's H200 epoch) for train.max_minutes=2 (the recordings of CUDA
#                graphs took the first 2.5 minutes before padding): how far it gets, the CUDA graphs it
#                records (config.yaml runtime:), the busy share
#   conformer    as the Transformer, recipes/librispeech100_conformer.yaml
# Stopped by train.max_minutes, the epochs validate where they stop, on 20 dev utterances (a short pass after
# the budget). Each part's files: $OUT/<part>/{log.txt,gpu.csv,exp/}. The minutes are the run's 10 minutes
# shared out: corpus and shapes side by side, then three trainings with their start-up and validation.
set -u
OUT=${OUT:?set OUT to a folder for the results}
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-570} ))  # the whole run, less a margin for the tool around it
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
echo "gpu_checks.sh $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" > "$SUMMARY"

left() { echo $(( DEADLINE - $(date +%s) )); }

# part NAME SECONDS COMMAND...: run COMMAND with NAME's timeout (capped by the deadline), its GPU sampled each
# second, its output in $OUT/NAME/log.txt; one line in the summary either way
part() {
  local name=$1 want=$2; shift 2
  local budget; budget=$(left)
  (( budget > want )) && budget=$want
  mkdir -p "$OUT/$name"
  if (( budget < 20 )); then
    echo "$name: not run (the run's 10 minutes were spent)" | tee -a "$SUMMARY"; return 0
  fi
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 \
    > "$OUT/$name/gpu.csv" 2>/dev/null &
  local sampler=$! start; start=$(date +%s)
  timeout --signal=INT --kill-after=15 "$budget" "$@" > "$OUT/$name/log.txt" 2>&1
  local status=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  local busy; busy=$(awk -F', ' '{s += $2; n++} END {if (n) printf "%.1f%% busy over %d samples, peak %d MiB", s / n, n, m; else print "no samples"} {if ($3 > m) m = $3}' "$OUT/$name/gpu.csv")
  local verdict="exit $status"; (( status == 124 || status == 130 )) && verdict="cut at its ${budget} s timeout"
  echo "$name: $verdict after $(( $(date +%s) - start )) s; GPU $busy" | tee -a "$SUMMARY"
  tail -n 5 "$OUT/$name/log.txt" | sed "s/^/    /" >> "$SUMMARY"
}

part env 30 bash -c 'nvidia-smi; python -c "
import torch
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"cudnn\", torch.backends.cudnn.version())
print(\"device\", torch.cuda.get_device_name(0))
print(\"sdpa priority order\", torch._C._get_sdp_priority_order())
print(\"cudnn sdp enabled\", torch.backends.cuda.cudnn_sdp_enabled())
"'

CORPUS=${CORPUS:-}
SHAPES='python benchmarks/shape_variety.py --device cuda --steps 20 &&
  python benchmarks/shape_variety.py --device cuda --steps 20 --pad-multiple 64'
if [[ -z "$CORPUS" ]]; then
  CORPUS=/tmp/c${HOURS:-30}
  jobs=$(( $(nproc) - 2 )); (( jobs < 1 )) && jobs=1
  part corpus 200 python benchmarks/gpu_corpus.py "$CORPUS" --hours "${HOURS:-30}" --jobs "$jobs" --quiet &
  corpus_pid=$!
  part shapes 110 bash -c "$SHAPES"
  wait "$corpus_pid"
else
  part shapes 110 bash -c "$SHAPES"
fi

# a run's own figures: its last log lines with s/update, how far into the epoch, its runtime record
run_epoch() {
  local name=$1 recipe=$2 minutes=$3; shift 3
  python -m asr.train "recipes/$recipe" "data.root=$CORPUS" "exp_dir=$OUT/$name/exp" train.max_epochs=1 \
    "train.max_minutes=$minutes" train.log_every_steps=25 train.valid_max_utterances=20 "$@" --verbose
  local status=$?
  grep -E "s/update|into epoch|recorded|runtime" "$OUT/$name/exp/train.log" 2>/dev/null | tail -n 12
  return $status
}

export -f run_epoch  # timeout runs a program, so each run goes through bash -c
export OUT CORPUS
part transformer 120 bash -c 'run_epoch transformer librispeech100_transformer.yaml 1'
part las 190 bash -c 'run_epoch las librispeech100.yaml 2 train.curriculum_epochs=0 train.schedules.max_duration=null \
  train.schedules.ctc_weight=null train.schedules.attention_prior=null'
part conformer 120 bash -c 'run_epoch conformer librispeech100_conformer.yaml 1'

echo "done $(date -u +%FT%TZ), $(left) s of the deadline left" | tee -a "$SUMMARY"
