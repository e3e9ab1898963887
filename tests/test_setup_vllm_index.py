"""run_all.sh's set-up: the vLLM build a GPU box gets, and the check that it can run beside the torch set-up installed.

vLLM's compiled kernels load only beside a torch built for the same CUDA major version. The registry's (PyPI's)
vllm 0.31.0 is a CUDA 13 build (its _C_stable_libtorch.abi3.so needs libcudart.so.13), while a CUDA 12.x driver gets a
cu12x torch, so the installed torch chooses: CUDA 13 -> the registry's wheel; CUDA 12 -> vLLM's own cu129 build from
https://wheels.vllm.ai/<version>/cu129; anything else -> no vLLM (one line; bench run on HF generate). torchvision
comes from torch's own PyTorch index. After installing, the CUDA major versions of torch, torchvision and vLLM must
agree and vLLM's extensions must import; otherwise set-up stops in one line naming the fix and writes no stamp.

Three layers: ``--print-vllm-index`` (the driver -> source mapping, nothing set up); set-up against the fake box of
tests/test_setup_torch_index.py, whose pip installs torchvision and vLLM stand-ins built for the CUDA that pip would
pick (or, through its state files, another); and the check itself (``vllm_check_py`` in run_all.sh) run on stand-in
packages, among them ELF files whose dynamic section names the libcudart they need.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_setup_torch_index import CU129_SUITE_INSTALL, ELF_WRITER, INDEX, VLLM_CU129, FakeBox

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
_elf: dict = {}
exec(ELF_WRITER, _elf)  # noqa: S102 - the test helper shared with the fake pip
elf_needing = _elf["elf_needing"]


# ----------------------------------------------------------------------------------------------
# driver CUDA version -> where vLLM comes from


def _print(tmp_path: Path, flag: str, version: str, **env: str) -> subprocess.CompletedProcess:
    # A copy beside pyproject.toml in an empty folder: were set-up triggered it would create .venv there.
    for name in ("run_all.sh", "pyproject.toml"):
        if not (tmp_path / name).exists():
            (tmp_path / name).write_text((REPO / name).read_text())
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
    proc = subprocess.run(["bash", str(tmp_path / "run_all.sh"), flag, version], capture_output=True, text=True,
                          timeout=30, env={**clean, **env})
    assert not (tmp_path / ".venv").exists()
    return proc


@pytest.mark.parametrize("driver", ["12.2", "12.4", "12.6", "12.8", "12.9"])
def test_a_12x_driver_gets_vllms_own_cuda_12_build(tmp_path: Path, driver: str) -> None:
    proc = _print(tmp_path, "--print-vllm-index", driver)
    assert (proc.returncode, proc.stdout) == (0, VLLM_CU129 + "\n"), proc.stderr
    # the same CUDA major version as the torch index the driver gets
    torch_tag = _print(tmp_path, "--print-torch-index", driver).stdout.strip().rsplit("/", 1)[1]
    assert re.fullmatch(r"cu12\d", torch_tag) and proc.stdout.strip().endswith("/cu129")


def test_a_cuda_13_driver_gets_the_registrys_wheel(tmp_path: Path) -> None:
    proc = _print(tmp_path, "--print-vllm-index", "13.0")
    assert (proc.returncode, proc.stdout) == (0, "pypi\n"), proc.stderr
    assert _print(tmp_path, "--print-torch-index", "13.0").stdout == f"{INDEX}cu130\n"


@pytest.mark.parametrize("driver", ["11.8", "11.4"])
def test_a_cuda_11_driver_gets_none_as_its_torch_does(tmp_path: Path, driver: str) -> None:
    # No torch can be installed there (--print-torch-index refuses it with status 2), so no vLLM either.
    proc = _print(tmp_path, "--print-vllm-index", driver)
    torch = _print(tmp_path, "--print-torch-index", driver)
    assert proc.returncode == torch.returncode == 2
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith(f"none: the NVIDIA driver supports CUDA {driver}")
    assert "update the driver" in proc.stdout


def test_the_index_follows_the_pinned_vllm_version(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text().replace(
        '"vllm==0.31.0"', '"vllm==0.31.1"'))
    assert _print(tmp_path, "--print-vllm-index", "12.4").stdout == "https://wheels.vllm.ai/0.31.1/cu129\n"


def test_bench_vllm_index_overrides_the_choice(tmp_path: Path) -> None:
    custom = "https://example.invalid/vllm/cu128"
    assert _print(tmp_path, "--print-vllm-index", "12.4", BENCH_VLLM_INDEX=custom).stdout == custom + "\n"
    proc = _print(tmp_path, "--print-vllm-index", "13.0", BENCH_VLLM_INDEX="")
    assert proc.returncode == 0
    assert proc.stdout.startswith("none: BENCH_VLLM_INDEX is set and empty") and proc.stdout.count("\n") == 1
    assert "generation.backend=transformers" in proc.stdout


def test_a_malformed_version_is_refused(tmp_path: Path) -> None:
    proc = _print(tmp_path, "--print-vllm-index", "twelve")
    assert proc.returncode == 2 and proc.stdout == "" and "not a CUDA version" in proc.stderr


# ----------------------------------------------------------------------------------------------
# set-up against a fake box


@pytest.fixture()
def box(tmp_path: Path) -> FakeBox:
    return FakeBox(tmp_path)


def _calls(box: FakeBox, word: str) -> list[str]:
    return [call for call in box.pip_calls if word in call]


def _index_of(call: str) -> str | None:
    match = re.search(r"--index-url (\S+)", call)
    return match.group(1) if match else None


def _suite_install(box: FakeBox) -> str | None:
    return next((call for call in box.pip_calls if call.startswith("install -e ")), None)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stderr.strip().splitlines()[-1]


def _vllm_version(box: FakeBox) -> str | None:
    meta = box.state / "site" / "vllm-0.31.0.dist-info" / "METADATA"
    return re.search(r"^Version: (.+)$", meta.read_text(), re.M).group(1) if meta.exists() else None


def test_a_cuda_12_box_gets_vllms_cu129_build_and_torchvision_from_torchs_index(box: FakeBox) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    (torchvision,) = _calls(box, "torchvision")
    assert _index_of(torchvision) == f"{INDEX}cu129" and "torch==2.13.0+cu129" in torchvision.split()
    assert box.pip_calls.index(torchvision) < box.pip_calls.index(CU129_SUITE_INSTALL)  # before vllm pins its own
    assert _vllm_version(box) == "0.31.0+cu129"
    assert box.stamp.read_text().split()[1:] == ["vllm"]


def test_a_cuda_13_box_gets_the_registrys_wheel(box: FakeBox) -> None:
    box.driver("13.0")
    box.set("working_tags", "cu130")
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert box.torch == "2.13.0+cu130"
    assert _index_of(_calls(box, "torchvision")[0]) == f"{INDEX}cu130"
    assert "install -e .[test,vllm]" in box.pip_calls  # nothing but the registry
    assert _vllm_version(box) == "0.31.0" and box.stamp.is_file()


def test_the_installed_torch_chooses_not_the_driver(box: FakeBox) -> None:
    # A CUDA 13 driver whose cu130 torch did not install falls back to cu129: vLLM follows torch to CUDA 12.
    box.driver("13.0")
    box.set("working_tags", "cu129")
    box.set("pip_fails", "cu130")
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert box.torch == "2.13.0+cu129" and CU129_SUITE_INSTALL in box.pip_calls
    assert _vllm_version(box) == "0.31.0+cu129"


def test_the_registrys_cuda_13_vllm_beside_a_cuda_12_torch_stops_set_up_in_one_line(box: FakeBox) -> None:
    # What set-up did before: pip's registry wheel (CUDA 13) beside the cu129 torch. Nothing runs, nothing stamped.
    box.driver("12.4")
    box.set("working_tags", "cu129")
    box.set("vllm_build", "cu130")
    proc = box.run_all()
    assert proc.returncode == 2 and not box.stamp.exists() and box.bench_args is None
    line = _last_line(proc)
    assert line.startswith("[run_all] error: vLLM 0.31.0 is built for CUDA 13 (its _moe_C.abi3.so needs "
                           "libcudart.so.13) beside torch 2.13.0+cu129, built for CUDA 12.9; ")
    assert "--without-vllm" in line and "BENCH_VLLM_INDEX" in line and VLLM_CU129 in line
    # removed: the rerun installs them again instead of keeping builds that satisfy vllm's pins
    assert "uninstall -y vllm torchvision" in box.pip_calls and _vllm_version(box) is None

    box.set("vllm_build", None)  # the rerun retries and gets the cu129 build
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert _vllm_version(box) == "0.31.0+cu129" and box.stamp.is_file()


def test_a_torchvision_of_another_cuda_major_stops_set_up(box: FakeBox) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    box.set("torchvision_build", "cu130")
    proc = box.setup()
    assert proc.returncode == 2 and not box.stamp.exists()
    line = _last_line(proc)
    assert line.startswith("[run_all] error: torchvision does not import (RuntimeError: Detected that PyTorch and "
                           "torchvision were compiled with different CUDA major versions.")
    assert "--without-vllm" in line

    box.set("torchvision_build", None)  # the rerun installs torch's own build again
    proc = box.setup()
    assert proc.returncode == 0, proc.stderr
    assert (box.state / "site" / "torchvision" / "version.py").read_text() == "cuda = 12090\n" and box.stamp.is_file()


def test_a_torchvision_whose_ops_did_not_load_stops_set_up(box: FakeBox) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    box.set("torchvision_ops_missing", "1")
    proc = box.setup()
    assert proc.returncode == 2 and not box.stamp.exists()
    assert _last_line(proc).startswith("[run_all] error: torchvision 0.28.0+cu129 reports no CUDA version")


@pytest.mark.parametrize("state, module", [("vllm_C_error", "vllm._C"),
                                           ("vllm_stable_error", "vllm._C_stable_libtorch")])
def test_a_vllm_extension_that_does_not_import_stops_set_up(box: FakeBox, state: str, module: str) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    box.set(state, "libcudart.so.13: cannot open shared object file: No such file or directory")
    proc = box.run_all()
    assert proc.returncode == 2 and not box.stamp.exists() and box.bench_args is None
    line = _last_line(proc)
    assert line.startswith(f"[run_all] error: vLLM 0.31.0+cu129's {module} does not import (ImportError: "
                           "libcudart.so.13: cannot open shared object file: No such file or directory); ")
    assert "--without-vllm" in line and "BENCH_VLLM_INDEX" in line


def test_an_empty_bench_vllm_index_installs_no_vllm_and_runs_hf_generate(box: FakeBox) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    proc = box.run_all("seeds=[0]", BENCH_VLLM_INDEX="")
    assert proc.returncode == 0, proc.stderr
    assert box.pip_calls and not _calls(box, "vllm") and not _calls(box, "torchvision")
    assert box.bench_args == "run --preset gsm8k-qwen0.5b generation.backend=transformers seeds=[0]"
    proc = box.run_all("--with-vllm", "--print-extras", BENCH_VLLM_INDEX="")
    assert proc.returncode == 2
    assert _last_line(proc) == ("[run_all] error: --with-vllm and BENCH_VLLM_INDEX= (no vLLM) contradict each other; "
                                "give one")
    assert box.run_all("--print-extras", BENCH_VLLM_INDEX="").stdout == "test\n"


@pytest.mark.parametrize("source, extra", [
    ("https://example.invalid/vllm/cu129", ["--extra-index-url", "https://example.invalid/vllm/cu129"]),
    ("https://example.invalid/vllm-0.31.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl",
     ["vllm @ https://example.invalid/vllm-0.31.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl"]),
])
def test_bench_vllm_index_names_the_source(box: FakeBox, source: str, extra: list[str]) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    proc = box.setup(BENCH_VLLM_INDEX=source)
    assert proc.returncode == 0, proc.stderr
    assert f"install -e .[test,vllm] {' '.join(extra)}" in box.pip_calls
    assert _vllm_version(box) == "0.31.0+cu129"


def test_a_bench_vllm_index_of_another_cuda_is_refused_by_the_check(box: FakeBox) -> None:
    box.driver("12.4")
    box.set("working_tags", "cu129")
    proc = box.setup(BENCH_VLLM_INDEX="https://example.invalid/vllm/cu130")
    assert proc.returncode == 2 and not box.stamp.exists()
    assert "vLLM 0.31.0 is built for CUDA 13" in _last_line(proc)


def test_a_torch_no_vllm_build_fits_runs_hf_generate_and_says_why(box: FakeBox) -> None:
    # A torch built for CUDA 11 (BENCH_TORCH_INDEX): vLLM 0.31.0 has no build for it.
    box.driver("12.4")
    box.set("working_tags", "cu118")
    env = {"BENCH_TORCH_INDEX": f"{INDEX}cu118"}
    proc = box.run_all("seeds=[0]", **env)
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "no vLLM" in line]
    assert line == ("[run_all] no vLLM: vLLM 0.31.0 has no build for CUDA 11, torch's CUDA major version (the "
                    "registry's wheel is built for CUDA 13, vLLM's own builds are cu129, cu130); the suite runs on HF "
                    "generate (generation.backend=transformers)")
    assert _suite_install(box) == "install -e .[test]" and _vllm_version(box) is None
    assert box.stamp.read_text().split()[1:] == ["no-vllm"]
    assert box.bench_args == "run --preset gsm8k-qwen0.5b generation.backend=transformers seeds=[0]"
    proc = box.run_all(**env)  # stamped: nothing set up again, still HF generate
    assert proc.returncode == 0 and box.pip_calls == []
    assert box.bench_args == "run --preset gsm8k-qwen0.5b generation.backend=transformers"

    proc = box.setup("--with-vllm", **env)  # asked for by name: one line, not a silent fallback
    assert proc.returncode == 2 and not box.stamp.exists()
    assert _last_line(proc).startswith("[run_all] error: --with-vllm, but vLLM 0.31.0 has no build for CUDA 11")


# ----------------------------------------------------------------------------------------------
# the check itself, on stand-in packages


def _check_script() -> str:
    text = (REPO / "run_all.sh").read_text()
    return re.search(r"read -r -d '' vllm_check_py <<'PY' \|\| true\n(.*?)\nPY\n", text, re.S).group(1)


class Site:
    """A folder of stand-in packages (torch, torchvision, vllm) the check runs on."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir()

    def package(self, name: str, files: dict[str, str | bytes]) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)
        (self.root / name).mkdir()
        for file, content in files.items():
            path = self.root / name / file
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)

    def torch(self, cuda: str | None, version: str = "2.13.0+cu129") -> None:
        self.package("torch", {"__init__.py": f"__version__ = {version!r}\nclass version:\n    cuda = {cuda!r}\n"})

    def torchvision(self, cuda: object, version: str = "0.28.0+cu129") -> None:
        self.package("torchvision", {"__init__.py": f"from . import version\n__version__ = {version!r}\n",
                                     "version.py": f"cuda = {cuda!r}\n"})

    def vllm(self, version: str, files: dict[str, str | bytes]) -> None:
        self.package("vllm", {"__init__.py": "", "_C.py": "", **files})
        info = self.root / "vllm-0.31.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")

    def check(self) -> str:
        proc = subprocess.run([sys.executable, "-W", "ignore", "-c", _check_script()], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONPATH": str(self.root)}, cwd=self.root)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("\n") == 1, proc.stdout  # one line: empty when nothing is wrong
        return proc.stdout.strip()


@pytest.fixture()
def site(tmp_path: Path) -> Site:
    site = Site(tmp_path / "site")
    site.torch("12.9")
    site.torchvision(12090)
    return site


def test_a_matching_set_passes(site: Site) -> None:
    site.vllm("0.31.0+cu129", {"_C_stable_libtorch.py": "",
                               "_moe_C.abi3.so": elf_needing("libc10.so", "libcudart.so.12")})
    assert site.check() == ""


def test_vllms_cuda_is_the_libcudart_its_extensions_need(site: Site) -> None:
    # The registry's wheel: no local tag, only the library it links says CUDA 13.
    site.vllm("0.31.0", {"_moe_C.abi3.so": elf_needing("libcudart.so.13", "libc10.so")})
    assert site.check() == ("vLLM 0.31.0 is built for CUDA 13 (its _moe_C.abi3.so needs libcudart.so.13) beside "
                            "torch 2.13.0+cu129, built for CUDA 12.9")


def test_the_linked_library_wins_over_the_version_tag(site: Site) -> None:
    site.vllm("0.31.0+cu129", {"_moe_C.abi3.so": elf_needing("libcudart.so.13")})
    assert site.check().startswith("vLLM 0.31.0+cu129 is built for CUDA 13 (its _moe_C.abi3.so needs")


def test_without_a_linked_libcudart_the_version_tag_tells(site: Site) -> None:
    site.vllm("0.31.0+cu129", {"_moe_C.abi3.so": elf_needing("libc10.so")})
    assert site.check() == ""
    site.vllm("0.31.0+cu130", {"_moe_C.abi3.so": elf_needing("libc10.so")})
    assert site.check() == ("vLLM 0.31.0+cu130 is built for CUDA 13.0 (its version's tag) beside torch "
                            "2.13.0+cu129, built for CUDA 12.9")
    site.vllm("0.31.0", {})
    assert site.check().startswith("cannot tell which CUDA vLLM 0.31.0 is built for")


@pytest.mark.parametrize("reported, message", [
    (13000, "torchvision 0.28.0 is built for CUDA 13.0 beside torch 2.13.0+cu129, built for CUDA 12.9"),
    ("13.0", "torchvision 0.28.0 is built for CUDA 13.0 beside torch 2.13.0+cu129, built for CUDA 12.9"),
    (None, "torchvision 0.28.0 reports no CUDA version (its compiled ops did not load, or it is a CPU build) beside "
           "torch 2.13.0+cu129, built for CUDA 12.9"),
])
def test_torchvisions_cuda_is_what_it_reports(site: Site, reported: object, message: str) -> None:
    site.vllm("0.31.0+cu129", {})
    site.torchvision(reported, version="0.28.0")
    assert site.check() == message


def test_a_cpu_torch_is_named(site: Site) -> None:
    site.vllm("0.31.0+cu129", {})
    site.torch(None, version="2.13.0+cpu")
    assert site.check() == "torch 2.13.0+cpu is a CPU build, and vLLM's kernels need a CUDA torch"


def test_vllm_c_stable_libtorch_is_imported_only_where_the_wheel_has_it(site: Site) -> None:
    site.vllm("0.31.0+cu129", {})
    assert site.check() == ""
    site.vllm("0.31.0+cu129", {"_C_stable_libtorch.py": "raise ImportError('undefined symbol: aoti_torch_abi')"})
    assert site.check() == ("vLLM 0.31.0+cu129's vllm._C_stable_libtorch does not import (ImportError: undefined "
                            "symbol: aoti_torch_abi)")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to link a real shared object")
def test_the_library_a_real_linker_records_is_read(site: Site, tmp_path: Path) -> None:
    # A shared object as a linker writes it (several segments, its string table away from offset 0) needing a
    # stand-in libcudart.so.13.
    (tmp_path / "a.c").write_text("int cudart_stub(void) { return 0; }\n")
    (tmp_path / "b.c").write_text("int cudart_stub(void);\nint kernel(void) { return cudart_stub(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libcudart.so.13"), "-Wl,-soname,libcudart.so.13",
                    str(tmp_path / "a.c")], check=True, capture_output=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "_C_stable_libtorch.abi3.so"),
                    str(tmp_path / "b.c"), f"-L{tmp_path}", "-l:libcudart.so.13"], check=True, capture_output=True)
    site.vllm("0.31.0", {"_C_stable_libtorch.abi3.so": (tmp_path / "_C_stable_libtorch.abi3.so").read_bytes()})
    assert site.check().startswith("vLLM 0.31.0 is built for CUDA 13 (its _C_stable_libtorch.abi3.so needs "
                                   "libcudart.so.13) beside torch 2.13.0+cu129")
