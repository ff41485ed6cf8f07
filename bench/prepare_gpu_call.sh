#!/usr/bin/env bash
# What a call of the device tool needs beside the checkout, made here, in the repository
# root, before the call (both folders are ignored through .git/info/exclude, so the call
# must name them in `carry`):
#   .whl/      corel's dependencies that the GPU machine's image lacks (pydantic and its
#              own), as wheels for its Python 3.12;
#   .gpudata/  MNIST (from ../shared/datasets, or $COREL_DATA_DIR) and Fashion-MNIST (Debian's
#              dataset-fashion-mnist), 41 MB together: the GPU machine reaches no network.
# Then, as on 2026-11-26 (an H100; see docs/reproduction.md):
#   run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
#       --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
#       export COREL_DATA_DIR=$PWD/.gpudata; PRECISION_CHECK=0 bash bench/on_gpu.sh $OUT 568",
#       carry=[".whl", ".gpudata"], timeout_s=600)
set -eu
cd "$(git rev-parse --show-toplevel)"
mkdir -p .git/info
for path in /.whl/ /.gpudata/; do
    grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude
done
PY=${PYTHON:-python3}
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "pydantic==2.12.5" "pydantic-core==2.41.5" "annotated-types==0.7.0" "typing-inspection==0.4.2"
mnist=${COREL_DATA_DIR:-../shared/datasets}/mnist
fashion=/usr/share/datasets/fashion-mnist
for dir in "$mnist" "$fashion"; do
    [ -f "$dir/train-images-idx3-ubyte.gz" ] || { echo "no IDX files in $dir" >&2; exit 1; }
done
mkdir -p .gpudata/mnist .gpudata/fashion-mnist
for pair in "$mnist:.gpudata/mnist" "$fashion:.gpudata/fashion-mnist"; do
    # (COREL_DATA_DIR may already be .gpudata itself: nothing to copy then)
    [ "$(realpath "${pair%%:*}")" = "$(realpath "${pair#*:}")" ] || cp "${pair%%:*}"/*-ubyte.gz "${pair#*:}/"
done
chmod -R u+w .gpudata
du -sh .whl .gpudata
