#!/usr/bin/env bash
# bench/prepare_gpu_call.sh: packs, beside this checkout, what bench/on_gpu.sh needs on a GPU
# machine that has no network access, so that the checkout and these two folders can be
# copied there as they are. Run it here, from anywhere in the repository:
#
#   [DATASETS="mnist fashion-mnist"] [PYTHON=python3] [MAX_MIB=N] bench/prepare_gpu_call.sh
#
# It writes (both folders ignored through .git/info/exclude, which it updates):
#   .whl/      corel's dependencies that a bare PyTorch image lacks (pydantic and its own), as
#              wheels for CPython 3.12 on x86-64 Linux, downloaded with PYTHON's pip;
#   .gpudata/  the datasets named in DATASETS (default both): MNIST from
#              $COREL_DATA_DIR/mnist (default ../shared/datasets/mnist) and Fashion-MNIST from
#              Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), 11 and 31 MB.
# Needs: network access here (pip), the IDX files above. No GPU.
# It prints the size of the checkout's tracked files and the two folders; with MAX_MIB, it
# fails when they pass that many MiB (a transfer with a size limit: copy fewer DATASETS).
#
# Then, on the GPU machine, from the copied checkout (as on 2026-11-27: an H100,
# Fashion-MNIST's CNN rows to 150 epochs in 404 s, docs/reproduction.md, section 9):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site COREL_DATA_DIR=$PWD/.gpudata DATASETS=fashion-mnist \
#       BENCH=after PRECISION_CHECK=0 bash bench/on_gpu.sh OUT 570
# Rows that stop short of 150 epochs bring back their state (OUT/state.tar.xz.NN); a later
# run resumes them with RESUME_FROM=<a folder holding those parts>.
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
for name in mnist fashion-mnist; do  # a dataset not named in DATASETS stays behind
    case " ${DATASETS:-mnist fashion-mnist} " in *" $name "*) ;; *) rm -rf ".gpudata/$name" ;; esac
done
chmod -R u+w .gpudata
du -sh .whl .gpudata
# What goes to the GPU machine: the tracked files (a state to resume from among them), .whl, .gpudata.
tracked=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$(( tracked + $(du -sb .whl | cut -f1) + $(du -sb .gpudata | cut -f1) ))
echo "the checkout's tracked files, .whl and .gpudata: $(( total / 1048576 )) MiB"
if [ -n "${MAX_MIB:-}" ] && [ "$total" -ge $(( MAX_MIB * 1048576 )) ]; then
    echo "over MAX_MIB=$MAX_MIB: copy fewer datasets (DATASETS)" >&2
    exit 1
fi
