#!/usr/bin/env bash
# The one command.
#   ./run_all.sh                 set up .venv if needed, run the default preset, write the report
#   ./run_all.sh --test [ARGS]   set up .venv if needed, run the test suite (ARGS go to pytest)
#   ./run_all.sh [--preset NAME] [bench run options / key.path=value overrides]
# Default preset: gsm8k-qwen0.5b when an NVIDIA GPU is visible, cpu-tiny otherwise.
# Environment: BENCH_PYTHON (interpreter for the venv), BENCH_TORCH (torch requirement used when no torch
# is installed yet and no GPU is visible; default torch==2.13.0, a CPU build on the machines we test on),
# BENCH_PIP_ARGS (extra pip arguments, e.g. an index for CPU wheels).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$root"
venv="$root/.venv"
stamp="$venv/.bench-setup"

say() { printf '[run_all] %s\n' "$*" >&2; }
die() { printf '[run_all] error: %s\n' "$*" >&2; exit 2; }

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

pick_python() {
  local candidate
  for candidate in "${BENCH_PYTHON:-}" python3.11 python3.12 python3.10 python3; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  return 1
}

setup_hash() { cat pyproject.toml run_all.sh | sha256sum | cut -d' ' -f1; }

setup() {
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(setup_hash)" ] && [ -x "$venv/bin/bench" ]; then
    return 0  # already set up for this pyproject.toml: seconds, not minutes
  fi
  local py
  py="$(pick_python)" || die "no Python >= 3.10 found; install python3.11 or set BENCH_PYTHON=/path/to/python3"
  local start=$SECONDS
  say "setting up $venv (first run only; about a minute) ..."
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || die "could not create $venv; install the venv module (apt-get install python3-venv)"
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install --upgrade pip >/dev/null 2>&1 || true
  if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
    say "reusing the torch already in $venv"
  elif has_gpu; then
    say "NVIDIA GPU found: installing torch (CUDA build)"
    # shellcheck disable=SC2086
    "${pip[@]}" install ${BENCH_PIP_ARGS:-} torch || die "pip could not install torch; check the network or set BENCH_PIP_ARGS"
  else
    # An unpinned torch on a machine without a GPU would pull a multi-GB CUDA build.
    local torch_req="${BENCH_TORCH:-torch==2.13.0}"
    say "no NVIDIA GPU: installing $torch_req (CPU build)"
    # shellcheck disable=SC2086
    "${pip[@]}" install ${BENCH_PIP_ARGS:-} "$torch_req" || die "pip could not install $torch_req; set BENCH_TORCH to a CPU torch you can install"
  fi
  # shellcheck disable=SC2086
  "${pip[@]}" install ${BENCH_PIP_ARGS:-} -e ".[test]" || die "pip could not install the suite's dependencies (see the messages above)"
  setup_hash > "$stamp"
  say "set-up done in $((SECONDS - start)) s"
}

mode=run
if [ "${1:-}" = "--test" ]; then mode=test; shift; fi

setup
export PYTHONUNBUFFERED=1

if [ "$mode" = test ]; then
  # Tests never touch the network: hub access is switched off for everything they start.
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  exec "$venv/bin/python" -m pytest -q "$@"
fi

preset=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) [ $# -ge 2 ] || die "--preset needs a name; list them with: .venv/bin/bench presets"; preset="$2"; shift 2 ;;
    --preset=*) preset="${1#--preset=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$preset" ]; then
  if has_gpu; then preset=gsm8k-qwen0.5b; else preset=cpu-tiny; fi
fi
say "preset: $preset"
exec "$venv/bin/bench" run --preset "$preset" ${args[@]+"${args[@]}"}
