#!/usr/bin/env bash
# The one command a session hands to the device tool (issue 6):
#
#     bash bench/gpu/run_on_device.sh [--quick] [measure.py options...]
#     bash bench/gpu/run_on_device.sh --diagnose     # the named misses' measurements (under 5 minutes)
#     bash bench/gpu/run_on_device.sh --preflight    # the preflight on the GPU: NVML health against nvidia-smi,
#                                                    # the NCCL collectives, `wizard preflight` (under 4 minutes)
#     bash bench/gpu/run_on_device.sh --alst         # ALST's single-GPU techniques, one at a time (under 5 minutes)
#
# Installs nothing from the network: only the wheels of bench/gpu/wheels (prepare_wheels.sh), when carried. Says what is there (python, torch + CUDA, transformers,
# accelerate, DeepSpeed, nvidia-ml-py, nvidia-smi), makes `wizard` importable (the checkout on
# PYTHONPATH; `pip install -e . --no-deps` offline only if that is not enough), then runs
# bench/gpu/measure.py under a global timeout and leaves everything in $OUT (default
# bench/results): gpu-<date>.md, its .json twin, gpu-<date>-files/ and run_on_device.log.
# measure.py writes its results after every step, so a run cut short still returns them.
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT="$PWD"
OUT="${OUT:-$ROOT/bench/results}"
mkdir -p "$OUT"
LOG="$OUT/run_on_device.log"
# The whole device call must end within 8 minutes (issue 28): about 25 s go to installing the wheels and
# listing what is there, so measure.py gets 445 s (--quick: 330 s) and starts nothing new after 410 (300).
DIAGNOSE=0
PREFLIGHT=0
NAME=gpu
case " $* " in
  *" --diagnose "*) DIAGNOSE=1; DEFAULT_TIMEOUT=255; DEFAULT_BUDGET=200 ;;
  *" --preflight "*) PREFLIGHT=1; DEFAULT_TIMEOUT=200; DEFAULT_BUDGET=150 ;;
  *" --alst "*) NAME=gpu-alst; DEFAULT_TIMEOUT=255; DEFAULT_BUDGET=200 ;;
  *" --quick "*) DEFAULT_TIMEOUT=330; DEFAULT_BUDGET=300 ;;
  *) DEFAULT_TIMEOUT=445; DEFAULT_BUDGET=410 ;;
esac
GLOBAL_TIMEOUT="${GPU_BENCH_TIMEOUT:-$DEFAULT_TIMEOUT}"   # seconds for measure.py, hard stop
BUDGET="${GPU_BENCH_BUDGET:-$DEFAULT_BUDGET}"             # measure.py stops starting new work after this
STAMP="$(date +%Y-%m-%d-%H%M)"

exec > >(tee -a "$LOG") 2>&1
echo "== run_on_device.sh $(date -Is) on $(hostname)"

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1; then PY="$(command -v "$candidate")"; break; fi
  done
fi
if [ -z "$PY" ]; then
  echo "BLOCKED: no python3 on this machine"
  printf '# GPU ground truth: blocked\n\nNo python3 on the device machine.\n' > "$OUT/$NAME-$STAMP.md"
  exit 2
fi
echo "python: $PY ($("$PY" --version 2>&1))"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L || true
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || true
else
  echo "nvidia-smi: not found"
fi

# What the GPU machine lacks (DeepSpeed, bitsandbytes, textual, questionary and their small needs), from the
# wheels bench/gpu/prepare_wheels.sh built where PyPI is reachable; the device tool carries the folder
# (carry: ["bench/gpu/wheels"]). Offline: --no-index, nothing else is looked for. Into the machine's own
# python (each device machine starts bare and is given back afterwards).
WHEELS="${GPU_BENCH_WHEELS:-$ROOT/bench/gpu/wheels}"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "== installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS ($(du -sh "$WHEELS" | cut -f1)), offline"
  t0=$(date +%s)
  if ! (set -o pipefail; "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-cache-dir \
         --disable-pip-version-check "$WHEELS"/*.whl 2>&1 | tail -5); then
    echo "pip install from $WHEELS failed (above); measure.py reports what is still missing"
  fi
  echo "   took $(( $(date +%s) - t0 )) s"
else
  echo "no wheels in $WHEELS (bash bench/gpu/prepare_wheels.sh builds them): installing nothing"
fi

# What is installed, without importing it (importing torch + deepspeed costs ~10 s each).
"$PY" - <<'EOF'
import importlib.metadata as md, importlib.util as u
for dist, mod in (("torch", "torch"), ("transformers", "transformers"), ("accelerate", "accelerate"),
                  ("deepspeed", "deepspeed"), ("peft", "peft"), ("bitsandbytes", "bitsandbytes"),
                  ("textual", "textual"), ("questionary", "questionary"), ("nvidia-ml-py", "pynvml"),
                  ("psutil", "psutil"), ("PyYAML", "yaml"), ("pip", "pip")):
    try:
        version = md.version(dist)
    except md.PackageNotFoundError:
        version = None
    found = u.find_spec(mod) is not None
    print(f"{dist:14s} {version or '-':20s} {'importable' if found else 'MISSING'}")
EOF

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ! "$PY" -c "import wizard.pipeline, launch.commands" 2>/dev/null; then
  echo "wizard not importable from the checkout; trying an offline editable install"
  "$PY" -m pip install -e . --no-deps --no-build-isolation --no-index 2>&1 | tail -3 || true
fi
if ! "$PY" -c "import wizard.pipeline, launch.commands"; then
  echo "BLOCKED: the wizard package does not import (see the error above; psutil/PyYAML missing?)"
fi

if [ "$DIAGNOSE" = 1 ]; then
  # bench/results/gpu-2026-12-04.md's named misses: is one-process ZeRO-3's step, and the 0.5B model's, bound by
  # the host? (bench/bench_zero3_overhead.py --preset gpu-misses: wall, host and profiled GPU-busy time per layer)
  echo "== bench_zero3_overhead.py --preset gpu-misses (budget ${BUDGET} s, hard timeout ${GLOBAL_TIMEOUT} s)"
  timeout -k 15 "$GLOBAL_TIMEOUT" "$PY" bench/bench_zero3_overhead.py --preset gpu-misses --device cuda \
    --budget-s "$BUDGET" --md "$OUT/zero3-overhead-$STAMP.md" --json "$OUT/zero3-overhead-$STAMP.json"
  rc=$?
  echo "== bench_zero3_overhead.py exit $rc"
  exit $rc
fi

if [ "$PREFLIGHT" = 1 ]; then
  # issue 41: what the CPU box cannot show of `wizard preflight` (bench/gpu/preflight_check.py)
  echo "== preflight_check.py (budget ${BUDGET} s, hard timeout ${GLOBAL_TIMEOUT} s)"
  timeout -k 15 "$GLOBAL_TIMEOUT" "$PY" bench/gpu/preflight_check.py --budget-s "$BUDGET" \
    --out "$OUT/preflight-$STAMP.md"
  rc=$?
  echo "== preflight_check.py exit $rc"
  exit $rc
fi

echo "== measure.py (budget ${BUDGET} s, hard timeout ${GLOBAL_TIMEOUT} s)"
timeout -k 15 "$GLOBAL_TIMEOUT" "$PY" bench/gpu/measure.py --out "$OUT/$NAME-$STAMP.md" --budget-s "$BUDGET" "$@"
rc=$?
echo "== measure.py exit $rc ($( [ $rc -eq 124 ] && echo 'hit the hard timeout' || echo done ))"
ls -la "$OUT" "$OUT/$NAME-$STAMP-files" 2>/dev/null || true
# The device tool brings back at most 8 files from $OUT: the raw files (one stderr tail per case, the launch's
# metrics and nvidia-smi samples, the loading ranks', tune's) travel as one archive beside the .md, .json and log.
if [ -d "$OUT/$NAME-$STAMP-files" ]; then
  tar -czf "$OUT/$NAME-$STAMP-files.tar.gz" -C "$OUT" "$NAME-$STAMP-files" && rm -rf "$OUT/$NAME-$STAMP-files"
fi
exit $rc
