#!/usr/bin/env bash
# What a call of the device tool needs beside the checkout, made here, in the repository
# root, before the call (both folders are ignored through .git/info/exclude, so the call
# must name them in `carry`):
#   .whl/      corel's dependencies that the GPU machine's image lacks (pydantic and its
#              own), as wheels for its Python 3.12;
#   .gpudata/  MNIST (from ../shared/datasets, or $COREL_DATA_DIR) and Fashion-MNIST (Debian's
#              dataset-fashion-mnist), 11 and 31 MB: the GPU machine reaches no network.
#              DATASETS="fashion-mnist" (or "mnist") copies only that one, for a call that
#              runs only its rows: with a tracked state to resume from (on_gpu.sh's
#              RESUME_FROM), both would not fit the 64 MiB that a call carries.
# Then, as on 2026-11-27 (an H100, Fashion-MNIST's CNN rows to 150 epochs in 404 s; see
# docs/reproduction.md, section 9), with DATASETS=fashion-mnist here:
#   run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
#       --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
#       export COREL_DATA_DIR=$PWD/.gpudata; BENCH=after PRECISION_CHECK=0
#       DATASETS=fashion-mnist bash bench/on_gpu.sh $OUT 570",
#       carry=[".whl", ".gpudata"], timeout_s=600)
# MNIST's rows the same way, DATASETS=mnist here and in the call (401 s, section 10); one
# extra row alone, as Fashion-MNIST's Gaussian-COREL at lambda 0.6 (145 s, section 11):
# bench/cnn_rows.py launch --datasets fashion-mnist --losses --extra-lam gaussian=0.6
# --stack-seeds. Rows that stop short of 150 epochs bring back their state
# (state.tar.xz.NN): commit those parts beside the rows in docs/runs/, and a later call adds
# RESUME_FROM=docs/runs/<that folder>.
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
for name in ${DATASETS:-mnist fashion-mnist}; do
    case "$name" in
        mnist) dir=$mnist ;;
        fashion-mnist) dir=$fashion ;;
        *) echo "DATASETS: $name is neither mnist nor fashion-mnist" >&2; exit 1 ;;
    esac
    [ -f "$dir/train-images-idx3-ubyte.gz" ] || { echo "no IDX files in $dir" >&2; exit 1; }
    # (COREL_DATA_DIR may already be .gpudata itself: nothing to copy then)
    if [ "$(realpath "$dir")" != "$(realpath -m ".gpudata/$name")" ]; then
        rm -rf ".gpudata/$name" && mkdir -p ".gpudata/$name" && cp "$dir"/*-ubyte.gz ".gpudata/$name/"
    fi
done
for name in mnist fashion-mnist; do  # a dataset this call does not train stays behind
    case " ${DATASETS:-mnist fashion-mnist} " in *" $name "*) ;; *) rm -rf ".gpudata/$name" ;; esac
done
chmod -R u+w .gpudata
du -sh .whl .gpudata
# What the call carries: the tracked files (a state to resume from among them), .whl, .gpudata.
tracked=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$(( tracked + $(du -sb .whl | cut -f1) + $(du -sb .gpudata | cut -f1) ))
echo "the call carries $(( total / 1048576 )) MiB of the 64 MiB it may"
[ "$total" -lt $(( 64 * 1048576 )) ] || { echo "over the 64 MiB: copy fewer datasets (DATASETS)" >&2; exit 1; }
