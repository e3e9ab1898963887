#!/usr/bin/env bash
# gpu_check.sh — the one-GPU systems check (issues 7 and 10): every stage and method on Qwen2.5-0.5B's real
# shape with random weights (no download), at the GPU preset's shapes, for 3 steps; then a per-run table of peak
# memory by source (cuda-allocated, cuda-reserved, nvml-process), median s/step, completions/s and the static
# accounting per network.
#
#   scripts/gpu_check.sh [--dry-run] [key.path=value ...]     run from anywhere; works in the repo root
#   scripts/gpu_check.sh --fetch-wheels DIR                    on a machine WITH a package index: download the
#                                                              suite's packages a bare GPU image lacks (below)
#
# Takes: about 5-8 minutes on one H100/H200-class GPU (estimated, not yet run on a GPU), bounded by
# GPU_CHECK_TIMEOUT (default 420 s) for the suite; set-up adds seconds when the packages are there. A CPU
# rehearsal at tiny scale (tests/test_gpu_check.py) takes about 2 minutes on 2 cores.
#
# Steps: pick a Python that can run the suite (see "Python" below); print nvidia-smi; run
# `bench run --preset systems-qwen0.5b` with the extra key=value overrides under a wall-clock guard (SIGINT at the
# limit, then SIGKILL 30 s later; the report is rebuilt from the finished runs' result files); print the table (python -m bench.gpu_check_table);
# copy the small files under $OUT/gpu-check/ when OUT is set (the suite folder itself holds model checkpoints).
# --dry-run: pick the Python, print the plan and the commands, run nothing (no GPU needed).
#
# Exit status: 0 when every run finished ok; 1 when any run failed or did not run; 124 when the guard stopped
# the suite (137 when it had to kill it 30 s later); 2 for a set-up problem (one line says what to do).
#
# Python, first that works: $GPU_CHECK_PYTHON; .venv/bin/python (made by ./run_all.sh); python3 (a GPU image's
# own, e.g. torch preinstalled) after installing the wheels in $GPU_CHECK_WHEELS (default .whl) offline, if the
# folder exists; else ./run_all.sh's own set-up (needs a package index) and .venv/bin/python.
#
# Environment:
#   OUT                  copy table.txt, results.csv, summary.md, results.json, run.log, nvidia-smi.txt to $OUT/gpu-check
#   GPU_CHECK_TIMEOUT    seconds the suite may run (default 420)
#   GPU_CHECK_PYTHON     interpreter to use
#   GPU_CHECK_WHEELS     wheel folder installed offline into a private site folder when python3 lacks packages
#   GPU_CHECK_SUITE_DIR  suite folder to write, relative to the repo root (default reports/gpu-check-<UTC time>)
#   GPU_CHECK_PRESET     preset (default systems-qwen0.5b)
#   GPU_CHECK_WHEEL_PYTHON  --fetch-wheels: the GPU image's Python version (default 3.12)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

preset="${GPU_CHECK_PRESET:-systems-qwen0.5b}"
limit="${GPU_CHECK_TIMEOUT:-420}"
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

dry_run=0
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --fetch-wheels)
      [ $# -ge 2 ] || die "--fetch-wheels needs a folder, e.g. --fetch-wheels .whl"
      fetch_wheels "$2"; exit 0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *=*) overrides+=("$1"); shift ;;
    *) die "unknown argument '$1'; give key.path=value overrides (e.g. train.steps=2), --dry-run or --fetch-wheels DIR" ;;
  esac
done

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"   # the suite from this checkout, also when not installed
py=""
pick_python
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # nothing is downloaded
run=("$py" -m bench run --preset "$preset" --out "$suite" ${overrides[@]+"${overrides[@]}"})

if [ "$dry_run" = 1 ]; then
  say "python: $py"
  say "would run (guard ${limit} s): ${run[*]}"
  say "then: $py -m bench.gpu_check_table $suite"
  "$py" -m bench run --preset "$preset" --dry-run ${overrides[@]+"${overrides[@]}"}
  exit 0
fi

copy_dir=""
if [ -n "${OUT:-}" ]; then copy_dir="$OUT/gpu-check"; mkdir -p "$copy_dir"; fi
log="$(mktemp "${TMPDIR:-/tmp}/gpu-check-log.XXXXXX")"

say "python: $py ($("$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
if command -v nvidia-smi >/dev/null 2>&1; then
  smi_copy=()
  if [ -n "$copy_dir" ]; then smi_copy=("$copy_dir/nvidia-smi.txt"); fi
  nvidia-smi 2>&1 | tee ${smi_copy[@]+"${smi_copy[@]}"} || say "nvidia-smi failed (see above)"
else
  say "no nvidia-smi on this machine"
fi

say "running (at most ${limit} s): ${run[*]}"
start=$SECONDS
set +e
timeout --signal=INT --kill-after=30 "$limit" "${run[@]}" 2>&1 | tee "$log"
bench_rc=${PIPESTATUS[0]}
set -e
say "suite finished in $((SECONDS - start)) s with status $bench_rc"
if [ "$bench_rc" = 124 ] || [ "$bench_rc" = 137 ]; then
  say "the ${limit} s guard stopped the suite: runs not finished show as interrupted / not run"
fi
if [ "$bench_rc" != 0 ] && [ -f "$suite/suite.json" ]; then
  # A suite stopped by the guard (or killed 30 s later) may not have written its report: rebuild it from the
  # result files, which every finished run wrote (seconds, no torch).
  "$py" -m bench report "$suite" >/dev/null || say "could not rebuild the report of $suite"
fi

set +e
"$py" -m bench.gpu_check_table "$suite" | tee "$log.table"
table_rc=${PIPESTATUS[0]}
set -e

if [ -n "$copy_dir" ]; then
  cp "$log" "$copy_dir/run.log"
  cp "$log.table" "$copy_dir/table.txt"
  for f in results.csv summary.md; do
    if [ -f "$suite/$f" ]; then cp "$suite/$f" "$copy_dir/"; fi
  done
  # Every run's result.json in one file: the report can be rebuilt from these (bench report needs the folder).
  "$py" - "$suite" "$copy_dir/results.json" <<'EOF' || say "could not gather the result files"
import json, sys
from pathlib import Path
suite = Path(sys.argv[1])
results = {p.parent.name: json.loads(p.read_text()) for p in sorted(suite.glob("runs/*/result.json"))}
Path(sys.argv[2]).write_text(json.dumps(results, indent=1))
EOF
  say "copied the table, results.csv, summary.md, results.json and the log to $copy_dir"
fi
rm -f "$log" "$log.table"
say "suite folder: $suite"

if [ "$bench_rc" != 0 ]; then exit "$bench_rc"; fi
exit "$table_rc"
