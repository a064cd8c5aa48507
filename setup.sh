#!/usr/bin/env bash
# setup.sh — makes a fresh Debian 12 machine ready for loom and builds it.
#
#   ./setup.sh                 install missing Debian packages, configure, build (Release)
#   ./setup.sh --debug         a Debug build instead
#   ./setup.sh --build-dir D   build in D (default: build)
#   ./setup.sh --no-install    never call apt-get (fail if something is missing)
#   ./setup.sh --jobs N        parallel build jobs (default: the number of cores)
#   ./setup.sh --no-data       skip preparing the datasets
#
# After building, it converts Debian's Fashion-MNIST and fortunes packages into
# data/fashion_mnist.h5 and data/fortunes.h5 (only when those files are missing).
#
# Packages are installed with apt-get (through sudo when not root) only when missing, so a
# second run goes straight to the build.
set -euo pipefail
cd "$(dirname "$0")"

build_dir=build
build_type=Release
install=1
data=1
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) build_type=Debug ;;
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift ;;
    --no-install) install=0 ;;
    --jobs|-j) jobs=${2:?--jobs needs a number}; shift ;;
    --no-data) data=0 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

packages=(
  build-essential cmake pkg-config
  libtbb-dev libeigen3-dev libdnnl-dev ocl-icd-opencl-dev opencl-c-headers libhdf5-dev libboost-program-options-dev libspdlog-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev liblzf-dev libxbyak-dev
  hdf5-tools dataset-fashion-mnist fortunes
  openmpi-bin libopenmpi-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$install" -eq 0 ]; then
    echo "setup.sh: missing Debian packages: ${missing[*]}" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup.sh: not root and no sudo; install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  echo "setup.sh: installing ${missing[*]}"
  $sudo apt-get update
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

echo "setup.sh: configuring ($build_type) in $build_dir"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="$build_type"
echo "setup.sh: building with $jobs jobs"
cmake --build "$build_dir" -j "$jobs"
if [ "$data" -eq 1 ]; then
  mkdir -p data
  if [ ! -f data/fashion_mnist.h5 ]; then
    "$build_dir/recipes/prepare_data" --fashion-mnist --output data/fashion_mnist.h5 --quiet
    echo "setup.sh: wrote data/fashion_mnist.h5"
  fi
  if [ ! -f data/fortunes.h5 ]; then
    "$build_dir/recipes/prepare_data" --text /usr/share/games/fortunes --output data/fortunes.h5 --quiet
    echo "setup.sh: wrote data/fortunes.h5"
  fi
fi
echo "setup.sh: done"
