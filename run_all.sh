#!/usr/bin/env bash
# The one command.
#   ./run_all.sh                 set up .venv if needed, run the default preset, write the report
#   ./run_all.sh --test [ARGS]   set up .venv if needed, run the test suite (ARGS go to pytest)
#   ./run_all.sh [--preset NAME] [bench run options / key.path=value overrides]
#   ./run_all.sh --gpus N [...]  each method run as N processes: bench run --launcher accelerate --num-processes N
#   ./run_all.sh --print-torch-index CUDA_VERSION
#                                for tests: print the PyTorch wheel index chosen for a driver that supports
#                                CUDA_VERSION (e.g. 12.4) and exit; sets nothing up
# Default preset: gsm8k-qwen0.5b when an NVIDIA GPU is visible, cpu-tiny otherwise.
# Torch is installed first, once, when .venv has none:
#   with an NVIDIA GPU: a CUDA build the driver supports, from the newest PyTorch wheel index not newer than
#   the driver's CUDA version (the "CUDA Version" nvidia-smi prints), e.g. 12.4 -> .../whl/cu124;
#   without one: torch==2.13.0 (a CPU build on the machines we test on).
# Environment:
#   BENCH_PYTHON      interpreter for the venv
#   BENCH_TORCH       torch requirement (default: torch on a GPU box, torch==2.13.0 without a GPU)
#   BENCH_TORCH_INDEX wheel index URL for torch on a GPU box (default: chosen from the driver, see above)
#   BENCH_PIP_ARGS    extra pip arguments for the torch install ONLY (e.g. an index of CPU wheels); the suite's
#                     own dependencies (trl, transformers, ...) are always installed from the default index,
#                     which a torch-only index would not serve
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$root"
venv="$root/.venv"
stamp="$venv/.bench-setup"

say() { printf '[run_all] %s\n' "$*" >&2; }
die() { printf '[run_all] error: %s\n' "$*" >&2; exit 2; }

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# PyTorch's CUDA wheel indexes, oldest first, as "CUDA version:index tag".
torch_indexes="11.8:cu118 12.1:cu121 12.4:cu124 12.6:cu126 12.8:cu128 12.9:cu129 13.0:cu130"

# torch_index_for CUDA_VERSION: the newest index whose CUDA version is not newer than the driver's
# (a wheel built for a newer CUDA than the driver supports cannot use the GPU). Fails when none fits.
torch_index_for() {
  local want="$1" best="" entry major minor
  [[ "$want" =~ ^([0-9]+)\.([0-9]+) ]] || return 1
  local want_n=$((10#${BASH_REMATCH[1]} * 1000 + 10#${BASH_REMATCH[2]}))
  for entry in $torch_indexes; do
    major="${entry%%.*}"; minor="${entry#*.}"; minor="${minor%%:*}"
    if [ $((10#$major * 1000 + 10#$minor)) -le "$want_n" ]; then best="${entry#*:}"; fi
  done
  [ -n "$best" ] || return 1
  echo "https://download.pytorch.org/whl/$best"
}

# The CUDA version the installed driver supports, from nvidia-smi's header ("CUDA Version: 12.4").
driver_cuda_version() {
  nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1 | grep .
}

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

install_cuda_torch() {
  local pip=("$@") index="${BENCH_TORCH_INDEX:-}" torch_req="${BENCH_TORCH:-torch}" cuda
  if [ -z "$index" ]; then
    cuda="$(driver_cuda_version)" || die "could not read the driver's CUDA version from nvidia-smi; set BENCH_TORCH_INDEX to a PyTorch wheel index your driver supports, e.g. https://download.pytorch.org/whl/cu124"
    index="$(torch_index_for "$cuda")" || die "the NVIDIA driver supports CUDA $cuda, older than any PyTorch build this suite installs (11.8 or newer); update the driver, or set BENCH_TORCH and BENCH_TORCH_INDEX to an older build"
    say "NVIDIA GPU found (driver supports CUDA $cuda): installing $torch_req from $index"
  else
    say "NVIDIA GPU found: installing $torch_req from $index (BENCH_TORCH_INDEX)"
  fi
  # shellcheck disable=SC2086
  "${pip[@]}" install ${BENCH_PIP_ARGS:-} --index-url "$index" "$torch_req" \
    || die "pip could not install $torch_req from $index; check the network, or set BENCH_TORCH_INDEX / BENCH_TORCH"
}

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
  local gpu=0
  if has_gpu; then gpu=1; fi
  if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
    say "reusing the torch already in $venv"
  elif [ "$gpu" = 1 ]; then
    install_cuda_torch "${pip[@]}"
  else
    # An unpinned torch on a machine without a GPU would pull a multi-GB CUDA build.
    local torch_req="${BENCH_TORCH:-torch==2.13.0}"
    say "no NVIDIA GPU: installing $torch_req (CPU build)"
    # shellcheck disable=SC2086
    "${pip[@]}" install ${BENCH_PIP_ARGS:-} "$torch_req" || die "pip could not install $torch_req; set BENCH_TORCH to a CPU torch you can install"
  fi
  if [ "$gpu" = 1 ] && ! "$venv/bin/python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    die "the torch in $venv cannot use the GPU nvidia-smi sees (a CPU build, or one newer than the driver); set BENCH_TORCH_INDEX to a build for your driver (e.g. https://download.pytorch.org/whl/cu124), remove .venv and rerun ./run_all.sh"
  fi
  # Deliberately without BENCH_PIP_ARGS: an index meant for torch wheels does not serve trl, transformers, ...
  "${pip[@]}" install -e ".[test]" || die "pip could not install the suite's dependencies (see the messages above)"
  setup_hash > "$stamp"
  say "set-up done in $((SECONDS - start)) s"
}

mode=run
case "${1:-}" in
  --test) mode=test; shift ;;
  --print-torch-index)
    # For tests of the driver -> index mapping: no set-up, no GPU needed.
    [ $# -ge 2 ] || die "--print-torch-index needs a CUDA version, e.g. --print-torch-index 12.4"
    [[ "$2" =~ ^[0-9]+\.[0-9]+ ]] || die "'$2' is not a CUDA version; give one like 12.4"
    torch_index_for "$2" || die "a driver supporting CUDA $2 is older than any PyTorch build this suite installs (11.8 or newer); update the NVIDIA driver"
    exit 0 ;;
esac

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
    --gpus) [ $# -ge 2 ] || die "--gpus needs a process count, e.g. --gpus 8"; args+=(--launcher accelerate --num-processes "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$preset" ]; then
  if has_gpu; then preset=gsm8k-qwen0.5b; else preset=cpu-tiny; fi
fi
say "preset: $preset"
exec "$venv/bin/bench" run --preset "$preset" ${args[@]+"${args[@]}"}
