#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the sources vendored in the llama-cpp-python sdist,
# so the production runtime comes from a package registry and nothing else. The result is
# cached per llama-cpp-python version under $LLAMAD_CACHE (default ~/.cache/llamad): a second
# run is a no-op. Prints the binary's path on stdout.
#
#   packaging/build-llama-server.sh [VERSION]
set -euo pipefail

version="${1:-0.3.36}"
cache="${LLAMAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamad}"
prefix="$cache/llama-server-$version-$(uname -m)"
bin="$prefix/bin/llama-server"

if [[ -x "$bin" ]] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

python="${PYTHON:-python3}"
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
    >&2
cmake --build "$work/build" --target llama-server -j "$jobs" >&2

mkdir -p "$prefix/bin"
install -m 0755 "$work/build/bin/llama-server" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
"$bin" --version >&2
rm -rf "$work"
echo "$bin"
