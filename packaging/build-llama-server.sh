#!/usr/bin/env bash
# Find or build llama.cpp's `llama-server` for a llama-cpp-python version, so the production
# runtime comes from a package registry and nothing else. Prints the binary's path on stdout.
#
# `make install` builds llama-cpp-python with packaging/llama-server/hook.cmake: its one
# compile of the vendored llama.cpp also makes llama-server, shipped in the package
# (site-packages/llama_cpp/bin, linked to the package's own shared libraries). With that
# version installed in $PYTHON's environment, this prints that binary and compiles nothing.
# Otherwise (e.g. a wheel pip had cached from a build without the hook) it builds a static
# llama-server from the sources vendored in the llama-cpp-python sdist, cached per version
# under $LLAMAD_CACHE (default ~/.cache/llamad): a second run is a no-op.
#
#   packaging/build-llama-server.sh [VERSION]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

version="${1:-0.3.36}"
python="${PYTHON:-python3}"

packaged="$("$python" - "$version" 2>/dev/null <<'EOF' || true
import importlib.metadata
import importlib.util
import pathlib
import sys

try:
    installed = importlib.metadata.version("llama-cpp-python")
except importlib.metadata.PackageNotFoundError:
    sys.exit(0)
spec = importlib.util.find_spec("llama_cpp")
if installed == sys.argv[1] and spec and spec.submodule_search_locations:
    print(pathlib.Path(spec.submodule_search_locations[0], "bin", "llama-server"))
EOF
)"
if [[ -n "$packaged" && -x "$packaged" ]] && "$packaged" --version >/dev/null 2>&1; then
    echo "$packaged"
    exit 0
fi

cache="${LLAMAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamad}"
# "-noamx": built without AMX kernels (packaging/llama-server/no-amx.cmake says why).
prefix="$cache/llama-server-$version-$(uname -m)-noamx"
bin="$prefix/bin/llama-server"

if [[ -x "$bin" ]] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

echo "llama-cpp-python $version in $python's environment carries no llama-server:" \
    "building one from its sdist (minutes)" >&2
work="$cache/build-llama-server-$version"
mkdir -p "$work"
sdist="$(ls "$work"/llama_cpp_python-"$version".tar.gz 2>/dev/null || true)"
if [[ -z "$sdist" ]]; then
    "$python" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$work" >&2
    sdist="$work/llama_cpp_python-$version.tar.gz"
fi
src="$work/llama_cpp_python-$version"
[[ -d "$src/vendor/llama.cpp" ]] || tar -xzf "$sdist" -C "$work"

jobs="${LLAMAD_BUILD_JOBS:-$(nproc)}"
# Static, CPU-only, no curl/openssl (models come from disk), and no web UI: the UI build
# would fetch a prebuilt bundle from the network, which air-gapped machines do not have.
cmake -S "$src/vendor/llama.cpp" -B "$work/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    "-DCMAKE_PROJECT_llama.cpp_INCLUDE=$here/llama-server/no-amx.cmake" \
    >&2
cmake --build "$work/build" --target llama-server -j "$jobs" >&2

mkdir -p "$prefix/bin"
install -m 0755 "$work/build/bin/llama-server" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
"$bin" --version >&2
rm -rf "$work"
echo "$bin"
