#!/usr/bin/env bash
# The kernels' portability checks the README reports ("Install / build wheels"). Not part of CI:
# emulation makes them take 10-30 minutes.
#
#   bash tools/check_portability.sh x86       # baseline build (-march=x86-64); the kernel tests
#                                             # natively, then on an emulated CPU without AVX/F16C
#   bash tools/check_portability.sh aarch64   # kernels cross-compiled for aarch64; the kernel
#                                             # tests under user-mode emulation
#
# Needs Debian's qemu-user-static (both) and gcc-aarch64-linux-gnu (aarch64), and root for the
# aarch64 check: it downloads Debian 12's arm64 python3.11 packages with apt-get download
# (adding the arm64 architecture to dpkg for the download only; unpacked into a folder, never
# installed) and the aarch64 wheels of numpy, msgpack, lz4, pytest and hypothesis (pip --platform).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kernel_tests=(tests/test_kernels.py tests/test_keyword_kernels.py tests/test_scoring.py)
git archive HEAD fastmem tests fuzz src_cython setup.py pyproject.toml README.md | tar -x -C "$work"

case "${1:-}" in
x86)
  py=$(python3 -c 'import sys; print(sys.executable)')
  py=$(readlink -f "$py")  # the interpreter itself (qemu cannot run pyenv's shell shims)
  cd "$work"
  # -march=x86-64: the baseline (also Debian gcc's default); the AVX2/AVX-512/F16C variants are
  # compiled by per-function target attributes and picked at run time.
  CFLAGS="-march=x86-64 -mtune=generic" FASTMEM_NO_OPENMP=1 "$py" setup.py -q build_ext --inplace
  PYTHONPATH=. "$py" -c 'import fastmem._kernels._ext.topk as t, fastmem._kernels._ext.vectors as v
print("native CPU: scan", t.simd(), "- F16C", v.HAVE_F16C)'
  # In-process, the tests run every dispatch level the CPU has (avx512vnni, avx2, none) and
  # both float16 conversions (F16C, portable).
  PYTHONPATH=. "$py" -m pytest -q -p no:cacheprovider "${kernel_tests[@]}"
  # Nehalem is x86-64-v2 (SSE4.2, no AVX, AVX2 or F16C): only the portable paths can run. It is
  # the lowest CPU worth emulating: numpy 2.4's own baseline is x86-64-v2 (under qemu64 it dies
  # with an illegal instruction before fastmem is imported).
  PYTHONPATH=. qemu-x86_64-static -cpu Nehalem "$py" -c 'import fastmem._kernels._ext.topk as t, fastmem._kernels._ext.vectors as v
print("emulated Nehalem: scan", t.simd(), "- F16C", v.HAVE_F16C)'
  PYTHONPATH=. qemu-x86_64-static -cpu Nehalem "$py" -m pytest -q -p no:cacheprovider "${kernel_tests[@]}"
  ;;
aarch64)
  mkdir -p "$work/debs" "$work/sysroot"
  added=0
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64 && added=1
    trap 'rm -rf "$work"; [ $added = 1 ] && dpkg --remove-architecture arm64 && apt-get update -qq' EXIT
  fi
  apt-get update -qq
  (cd "$work/debs" && apt-get download -q python3.11-minimal:arm64 libpython3.11-minimal:arm64 \
    libpython3.11-stdlib:arm64 libpython3.11:arm64 libpython3.11-dev:arm64 libc6:arm64 \
    libexpat1:arm64 zlib1g:arm64 libffi8:arm64 libssl3:arm64 libbz2-1.0:arm64 liblzma5:arm64 \
    libuuid1:arm64 libgcc-s1:arm64 libstdc++6:arm64)
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/sysroot"; done
  python3 -m pip install -q --target "$work/site" --only-binary=:all: --implementation cp \
    --python-version 3.11 --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
    numpy msgpack lz4 pytest hypothesis
  cd "$work"
  python3 -c 'from Cython.Build import cythonize; cythonize("src_cython/*.pyx", include_path=["src_cython"],
    compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False,
    "cdivision": True, "initializedcheck": False, "embedsignature": True, "autotestdict": False})'
  sys=$work/sysroot/usr/include
  for pyx in src_cython/*.pyx; do
    m=$(basename "$pyx" .pyx)
    # setup.py's release flags (no OpenMP); -ffp-contract=off matters most here: gcc fuses
    # multiply-adds on aarch64 by default, and the kernels must round as numpy does.
    aarch64-linux-gnu-gcc -shared -fPIC -O3 -ffp-contract=off -fno-strict-overflow -DNDEBUG \
      -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION -Isrc_cython -I"$work/site/numpy/_core/include" \
      -I"$sys" -I"$sys/python3.11" "src_cython/$m.c" -o "fastmem/_kernels/_ext/$m.cpython-311-aarch64-linux-gnu.so"
  done
  run() { PYTHONPATH="$work:$work/site" qemu-aarch64-static -L "$work/sysroot" "$work/sysroot/usr/bin/python3.11" "$@"; }
  run -c 'import platform, fastmem, fastmem._kernels._ext.topk as t
print(platform.machine(), "kernels", fastmem.BACKEND, "- scan", t.simd())'
  # The fork test starts a child Python (sys.executable): an aarch64 binary the host cannot run
  # without binfmt_misc, which this container lacks. These kernels have no OpenMP anyway.
  run -m pytest -q -p no:cacheprovider "${kernel_tests[@]}" \
    --deselect tests/test_kernels.py::test_threaded_kernels_work_in_a_forked_child
  ;;
*)
  echo "usage: bash tools/check_portability.sh x86|aarch64" >&2
  exit 2 ;;
esac
echo "check_portability $1: done ($root)"
