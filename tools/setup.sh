#!/usr/bin/env bash
# Gets a machine ready to build: checks what the build needs and, on Debian/Ubuntu, installs what
# is missing with apt-get (as root, or through sudo). The README's first command and .ci/run use it.
#
# Usage: tools/setup.sh [--docs] [--plot]
#   always   CMake >= 3.25, Ninja, a C++17 compiler, doctest, Google Benchmark; the CUDA toolkit
#            (nvcc >= 12.4) must already be installed: it is not an apt package of Debian's main.
#   --docs   also Doxygen and Python 3 (the docs target and its link check)
#   --plot   also matplotlib for $PYTHON (default python3; tools/plot.py): Debian's package for
#            the system Python, else pip with tools/requirements.txt
# Whatever it cannot provide, it names in one line with what to do, and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

docs=0 plot=0
for arg in "$@"; do
  case $arg in
    --docs) docs=1 ;;
    --plot) plot=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

fail() { echo "setup: $*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
# version_ge A B: true when version A >= version B.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
cmake_version() { cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p'; }

apt=0
have apt-get && have dpkg-query && apt=1
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# Debian packages to install, and (elsewhere) the things to ask the user for.
packages=()
missing=()
need() {  # need PACKAGE WHAT: WHAT is missing; on Debian/Ubuntu PACKAGE provides it
  if [ $apt = 1 ]; then packages+=("$1"); else missing+=("$2"); fi
}

# The CUDA toolkit first: nothing else is worth installing without it. CMake also finds nvcc in
# /usr/local/cuda/bin when it is not on PATH.
nvcc=$(command -v nvcc || true)
for candidate in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
  [ -z "$nvcc" ] && [ -x "$candidate" ] && nvcc=$candidate
done
[ -n "$nvcc" ] || fail "nvcc not found: install the CUDA toolkit >= 12.4 (https://developer.nvidia.com/cuda-downloads) and put its bin/ on PATH"
nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
version_ge "$nvcc_version" 12.4 || fail "$nvcc is CUDA $nvcc_version: the stages need CUDA >= 12.4"

if ! have cmake || ! version_ge "$(cmake_version)" 3.25; then need cmake "CMake >= 3.25"; fi
have ninja || need ninja-build "Ninja"
have c++ || have g++ || need g++ "a C++17 compiler (g++ or clang++)"
# doctest and Google Benchmark count as present when CMake can find their package configuration
# (a Debian package or an install from source); the build can also download them (FetchContent).
cmake_config() {  # cmake_config NAME: NAME's CMake package configuration is installed
  find /usr /usr/local /opt $(echo "${CMAKE_PREFIX_PATH:-}" | tr : " ") -maxdepth 6 \( -name "$1Config.cmake" -o \
    -name "$1-config.cmake" \) -print -quit 2>/dev/null | grep -q .
}
if [ $apt = 1 ]; then
  installed doctest-dev || cmake_config doctest || packages+=(doctest-dev)
  installed libbenchmark-dev || cmake_config benchmark || packages+=(libbenchmark-dev)
fi
if [ $docs = 1 ]; then
  have doxygen || need doxygen "Doxygen"
  have python3 || need python3 "Python 3"
fi

# matplotlib belongs to one interpreter, $PYTHON (default: python3 on PATH): the system one gets
# Debian's package, any other (a venv, pyenv, conda) gets pip and tools/requirements.txt.
python=${PYTHON:-python3}
pip_plot=0
if [ $plot = 1 ]; then
  if ! have "$python"; then
    need python3-matplotlib "Python 3 with matplotlib"
  elif ! "$python" -c "import matplotlib" >/dev/null 2>&1; then
    python_path=$(readlink -f "$(command -v "$python")")
    if [ $apt = 1 ] && [[ $python_path == /usr/bin/* ]]; then packages+=(python3-matplotlib); else pip_plot=1; fi
  fi
fi

if [ ${#missing[@]} -gt 0 ]; then
  fail "missing: $(IFS=,; echo "${missing[*]}" | sed 's/,/, /g'); this script installs packages only on Debian/Ubuntu (apt-get): install them, then run it again"
fi

if [ ${#packages[@]} -gt 0 ]; then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    have sudo || fail "installing ${packages[*]} needs root: run this script as root or install them"
    sudo=(sudo)
  fi
  echo "setup: installing ${packages[*]} (apt-get)"
  log=$(mktemp)
  # No retries and short timeouts: without a network this fails in seconds, not minutes.
  apt_options=(-q -o Acquire::Retries=0 -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20)
  if ! { "${sudo[@]}" apt-get "${apt_options[@]}" update &&
         "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_options[@]}" install -y \
           --no-install-recommends "${packages[@]}"; } >"$log" 2>&1; then
    tail -n 5 "$log" >&2
    fail "apt-get could not install ${packages[*]} (no network or package source?): install them, then run this script again"
  fi
  rm -f "$log"
  if ! version_ge "$(cmake_version)" 3.25; then
    fail "CMake $(cmake_version) is older than 3.25: install a newer one (python3 -m pip install cmake, or https://apt.kitware.com)"
  fi
fi

if [ $pip_plot = 1 ]; then
  echo "setup: installing tools/requirements.txt for $(command -v "$python") (pip)"
  "$python" -m pip install -q -r tools/requirements.txt ||
    fail "pip could not install matplotlib for $(command -v "$python"): $python -m pip install -r tools/requirements.txt, or PYTHON=/usr/bin/python3 with Debian's python3-matplotlib"
fi

compiler=$(command -v c++ || command -v g++)
echo "setup: ready: CMake $(cmake_version), Ninja $(ninja --version), $("$compiler" --version | head -n1)," \
     "CUDA $nvcc_version ($nvcc)"
