#!/usr/bin/env bash
# Everything the GPU machine lacks for bench/gpu v2, as wheels in one folder (issue 28), built HERE (this
# machine reaches PyPI; the GPU machine reaches nothing):
#
#     bash bench/gpu/prepare_wheels.sh [DIR]          # default bench/gpu/wheels (gitignored)
#
# - DeepSpeed: PyPI has only its sdist; it is built into a pure-Python wheel (DS_BUILD_OPS=0: no op is
#   compiled here, cpu_adam is JIT-built on the GPU machine on first use, as in shared/gpu/2026-12-04);
# - bitsandbytes (QLoRA's NF4), textual and questionary (the wizard's UI imports), and the small pure-Python
#   or cp312 packages these need that the GPU machine's image may lack or hold too old (hjson, pydantic,
#   rich's markdown stack, prompt_toolkit, ...). The image's own torch, numpy, packaging, psutil, tqdm and
#   ninja are relied on (KINDS.md's package list) and never carried.
# Versions are this checkout's .venv's (the newest tested); the target is the GPU machine's python3
# (CPython 3.12, manylinux x86_64). The folder must stay under WHEELS_LIMIT_MB (50): the device tool carries
# at most 64 MiB of ignored paths. Ends by checking that every wheel's requirements are in the folder or
# in the image, and prints the total size.
#
# run_on_device.sh installs from the folder with `pip install --no-index --find-links DIR` when it is there;
# the device tool needs `carry: ["bench/gpu/wheels"]`.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR="${1:-bench/gpu/wheels}"
PY="${PYTHON:-.venv/bin/python}"
LIMIT_MB="${WHEELS_LIMIT_MB:-50}"
PURE=(--only-binary=:all: --no-deps --python-version 3.12 --implementation py --abi none --platform any)
TARGET=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
        --platform any)
# bitsandbytes 0.50.0, not the .venv's 0.50.2: its x86_64 wheel is 40.9 MB against 43.1 MB (both carry the
# CUDA 11.8-13.2 libraries), and 0.50.2 brought the folder to 52.6 MB; the NF4 path QLoRA uses is the same.
BNB_VERSION="${BNB_VERSION:-0.50.0}"

installed_version() {      # the .venv's version; empty when it lacks the package (then PyPI's newest)
  "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print('')" "$1"
}

# What is carried. The version is the .venv's; a pure-Python wheel where one exists (smaller: wcwidth's
# is 0.3 MB against 0.8 for its compiled one).
CARRIED=(
  "bitsandbytes==$BNB_VERSION"  # QLoRA: NF4 quantisation (the GPU machine has none)
  textual questionary     # the wizard's UI: `import wizard.frontends` needs them
  platformdirs mdit-py-plugins linkify-it-py uc-micro-py markdown-it-py mdurl rich pygments typing_extensions
  prompt_toolkit wcwidth  # questionary's
  hjson pydantic pydantic_core annotated-types typing-inspection py-cpuinfo msgpack einops   # DeepSpeed's
)

mkdir -p "$DIR"
rm -f "$DIR"/*.whl
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

DS_VERSION="$(installed_version deepspeed)"
echo "== deepspeed $DS_VERSION: sdist -> pure-Python wheel (DS_BUILD_OPS=0)"
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$WORK/sdist" "deepspeed==$DS_VERSION" 2>&1 \
  | grep -v "^WARNING: Location" || true
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/ds" "$WORK"/sdist/deepspeed-*.tar.gz
cp "$WORK"/ds/deepspeed-*.whl "$DIR"/

quiet() { grep -v "^WARNING: Location" || true; }    # this machine's pip.conf names local indexes it lacks
for dist in "${CARRIED[@]}"; do
  if [[ "$dist" == *==* ]]; then
    spec="$dist"
  else
    version="$(installed_version "$dist")"
    spec="$dist${version:+==$version}"      # not in the .venv: PyPI's newest
  fi
  echo "== $spec"
  if ! "$PY" -m pip download -q "${PURE[@]}" -d "$DIR" "$spec" >/dev/null 2>&1; then
    "$PY" -m pip download -q "${TARGET[@]}" -d "$DIR" "$spec" 2>&1 | quiet
  fi
done

# Every requirement of every carried wheel (for CPython 3.12 on Linux, extras named by a requirement
# included) must be in the folder or in the GPU machine's image.
"$PY" - "$DIR" "$LIMIT_MB" <<'EOF'
import re, sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

IN_IMAGE = {"torch", "numpy", "packaging", "psutil", "tqdm", "ninja"}   # KINDS.md: the image's packages
folder, limit_mb = Path(sys.argv[1]), float(sys.argv[2])
wheels = sorted(folder.glob("*.whl"))
meta = {}
for w in wheels:
    with zipfile.ZipFile(w) as z:
        text = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    name = canonicalize_name(re.search(r"^Name: (.+)$", text, re.M).group(1).strip())
    meta[name] = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
                  if line.startswith("Requires-Dist:")]
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix"}
missing = []
todo = [(n, "") for n in meta]
seen = set()
while todo:
    name, extra = todo.pop()
    if (name, extra) in seen:
        continue
    seen.add((name, extra))
    for req in meta.get(name, []):
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        dep = canonicalize_name(req.name)
        if dep in IN_IMAGE:
            continue
        if dep not in meta:
            missing.append(f"{name}{'[' + extra + ']' if extra else ''} needs {req}")
            continue
        for e in req.extras or [""]:
            todo.append((dep, e))
total = sum(w.stat().st_size for w in wheels)
for w in wheels:
    print(f"  {w.stat().st_size / 2**20:7.2f} MiB  {w.name}")
print(f"total: {len(wheels)} wheels, {total / 2**20:.1f} MiB ({total / 1e6:.1f} MB) in {folder}")
if missing:
    print("MISSING (neither carried nor in the GPU image):\n  " + "\n  ".join(sorted(set(missing))))
    sys.exit(1)
if total / 1e6 > limit_mb:
    print(f"TOO LARGE: {total / 1e6:.1f} MB > {limit_mb:g} MB")
    sys.exit(1)
print("requirements: all in the folder or in the GPU image")
EOF
