#!/usr/bin/env bash
# bench/on_gpu.sh: corel's GPU checks, its throughput benchmarks and the paper's CNN rows
# on one GPU machine, in one go, within a time limit.
#
# Usage, from the repository root:   bench/on_gpu.sh OUT_DIR [SECONDS]
#   OUT_DIR   where everything is written (created if missing);
#   SECONDS   the time limit for the whole run (default 540). CNN rows still training 45 s
#             before it stop there, say how many epochs they had, and leave their state
#             to resume from (RESUME_FROM, below).
#
# What it does, in order:
#   0. records the machine (nvidia-smi, cores, torch, CUDA) in OUT_DIR/machine.txt and runs
#      the CUDA graphs' tests (tests/gpu/test_graphs.py, output at its end); only where they
#      pass do the benchmarks add graphed lines and the rows train with CUDA graphs;
#   1. the benchmarks on the quiet GPU, each eager and graphed, against the GPU's own
#      matrix-product rate: train_throughput fp32 and bf16, sweep_throughput (FFNN, and the
#      CNN rows' shape), distance_backward; in OUT_DIR/bench.txt;
#   2. the paper's CNN rows (bench/cnn_rows.py: MNIST and Fashion-MNIST, the four losses,
#      3 seeds, 150 epochs, a row's seeds stacked in one process) with the bf16 check beside
#      them, and `make test-gpu` while they train: OUT_DIR/rows.jsonl, rows.txt (ending in the
#      Markdown table), test-gpu.txt, and the rows' state as OUT_DIR/state.tar.xz.NN (parts
#      of at most 15 MiB, small enough to commit beside the rows; .gz without xz).
#
# Needs: an NVIDIA GPU that torch sees (nvidia-smi; NVIDIA MPS is used where it starts);
# MNIST and Fashion-MNIST as IDX files under $COREL_DATA_DIR/mnist and /fashion-mnist (else
# the system locations); PYTHON (default python3) with torch and corel's dependencies
# importable, corel itself from this checkout (for a machine without network,
# bench/prepare_gpu_call.sh packs what it lacks). Time: both datasets' rows to 150 epochs
# take about 7 minutes each on an H100 (docs/reproduction.md, sections 9-10); the
# benchmarks add a few minutes (each is cut off at 1-2.5 minutes, twice with graphs). With
# less time, run again with RESUME_FROM.
#
# Options, as environment variables:
#   DATASETS="mnist"           the rows of one dataset only (default "mnist fashion-mnist");
#   PRECISION_CHECK=0          without the bf16 check's 6 runs;
#   BENCH=0 | BENCH=after      no benchmarks, or after the rows in the time they leave
#                              (default: before them);
#   STACK_SEEDS=0              one process per run instead of a row's seeds stacked;
#   EXTRA_LAMS="gaussian=0.6"  a row more per dataset of that loss at that lambda;
#   GRAPHS=0, MPS=0            no CUDA graphs (untested), no MPS;
#   NATIVE=1                   first build corel's native step for this machine's torch
#                              (about a minute; into COREL_NATIVE_DIR, default OUT_DIR/native);
#   RESUME_FROM=DIR            resume every row from DIR's state.tar.* parts (an earlier
#                              run's OUT_DIR, or a committed copy of them).
# COREL_CUDA_GRAPHS, COREL_NATIVE and COREL_NATIVE_DIR reach the benchmarks and the rows as
# they reach `corel train`: read by corel.cli.engine_options(os.environ) in each script.
set -u
OUT=${1:?usage: bench/on_gpu.sh OUT_DIR [SECONDS]}
LIMIT=${2:-540}
PY=${PYTHON:-python3}
T0=$(date +%s)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
left() { echo $((LIMIT - ($(date +%s) - T0))); }

{ nvidia-smi; nproc; "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"; } \
    >"$OUT/machine.txt" 2>&1
# Fail fast (and cheaply) when the library does not import here.
"$PY" -c "import corel.train.solo, corel.train.stacked, corel.serving" || { echo "corel does not import"; exit 1; }
# NATIVE=1: compile corel's fused nodes for this machine's torch first (about a minute of
# the time limit; a build made elsewhere is keyed to its own torch and Python and never loads).
if [ "${NATIVE:-0}" = 1 ]; then
    export COREL_NATIVE_DIR=${COREL_NATIVE_DIR:-$OUT/native}
    timeout 150 "$PY" -m corel.native build --optional >"$OUT/native.txt" 2>&1
fi

# CUDA graphs (corel.train.graphs; the default on CUDA since they passed these tests on an H100 on
# 2026-11-27): their tests run first (output at the end of machine.txt), and only where they
# pass do the benchmarks add graphed lines and the CNN rows train with them (a torch or a
# GPU they fail on trains eagerly). GRAPHS=0: off, untested.
GRAPHS_OK=0
if [ "${GRAPHS:-1}" != 0 ]; then
    echo "== tests/gpu/test_graphs.py" >>"$OUT/machine.txt"
    COREL_REQUIRE_CUDA=1 timeout 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_graphs.py \
        >>"$OUT/machine.txt" 2>&1 && GRAPHS_OK=1
    echo "CUDA graphs: $GRAPHS_OK (tests done at $(( $(date +%s) - T0 )) s)" | tee -a "$OUT/machine.txt"
fi

# BENCH=after: the benchmarks once the rows have ended, in what is left of the time (the
# rows first, on a quiet GPU after them); BENCH=0: none; else before the rows.
# The benchmarks' images: Fashion-MNIST, as in the docs' figures, unless the run has only
# MNIST (DATASETS=mnist: on 2026-11-27 every benchmark of such a run stopped at a missing
# Fashion-MNIST).
case " ${DATASETS:-mnist fashion-mnist} " in
    *" fashion-mnist "*) BENCH_DATASET=fashion-mnist ;;
    *) BENCH_DATASET=mnist ;;
esac
cap() { local t=$(( $(left) - 15 )); [ "$t" -gt "$1" ] && t=$1; [ "$t" -gt 5 ] && echo "$t" || echo 1; }  # (timeout 0 would be none)
# One benchmark eager, then graphed (where the graphs' tests passed): pair NAME SECONDS ARGS...
pair() {
    local name=$1 limit=$2 graphs
    shift 2
    for graphs in 0 $([ "$GRAPHS_OK" = 1 ] && echo 1); do
        echo "== $name (COREL_CUDA_GRAPHS=$graphs)"
        COREL_CUDA_GRAPHS=$graphs timeout "$(cap "$limit")" "$PY" "$@" --device cuda --dataset "$BENCH_DATASET"
    done
}
benchmarks() {
    # Pair by pair, so that a run cut short by its time limit still leaves pairs.
    {
        pair "train_throughput fp32" 150 bench/train_throughput.py
        # The CNN rows' shape: one lambda, 3 seeds stacked (vmap) against one after another.
        pair "sweep_throughput CNN seeds" 120 bench/sweep_throughput.py \
            --model cnn --members 1 --seeds 3 --train-subset 12800 --repeats 2
        pair "sweep_throughput" 150 bench/sweep_throughput.py
        pair "train_throughput bf16" 120 bench/train_throughput.py --precision bf16
        echo "== distance_backward"  # Gaussian-COREL's distance gradient: corel's against cdist's
        timeout "$(cap 60)" "$PY" bench/distance_backward.py --device cuda
    } >>"$OUT/bench.txt" 2>&1
    echo "benchmarks done at $(( $(date +%s) - T0 )) s"
}
case "${BENCH:-1}" in 0|after) ;; *) benchmarks ;; esac

# The runs' kernels are small: without MPS the GPU time-slices between the 30 processes
# and runs one process's kernels at a time (on 2026-11-26 an H200 gave each CNN run 6.8 s
# an epoch so). NVIDIA's Multi-Process Service lets them run side by side; where it does not
# start, or a CUDA call fails under it, the runs go on without it. MPS=0 leaves it off.
MPS_ON=0
if [ "${MPS:-1}" != 0 ] && command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/corel-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/corel-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d && timeout 60 "$PY" -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
        MPS_ON=1
    else
        echo quit | nvidia-cuda-mps-control 2>/dev/null
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    fi
fi
echo "MPS: $MPS_ON" | tee -a "$OUT/machine.txt"

# The runs' resumable state (bench/cnn_rows.py --state), outside OUT_DIR while they train.
STATE=/tmp/corel-rows-state
rm -rf "$STATE" && mkdir -p "$STATE"
if [ -n "${RESUME_FROM:-}" ]; then
    set -- "$RESUME_FROM"/state.tar.*
    [ -f "$1" ] || { echo "RESUME_FROM=$RESUME_FROM holds no state.tar.* parts"; exit 1; }
    case "$1" in *.xz.*) UNZIP="xz -dc" ;; *) UNZIP="gzip -dc" ;; esac
    cat "$@" | $UNZIP | tar -xf - -C "$STATE" || { echo "cannot unpack the state in $RESUME_FROM"; exit 1; }
    echo "resuming from $RESUME_FROM: $(ls "$STATE" | wc -l) state file(s)"
fi

# Leave 45 s for the clustering of the last runs and the table.
CHECK=--precision-check
[ "${PRECISION_CHECK:-1}" = 0 ] && CHECK=
STACK=--stack-seeds
[ "${STACK_SEEDS:-1}" = 0 ] && STACK=
# EXTRA_LAMS="gaussian=0.6": a row more per dataset of that loss at that lambda, beside the
# paper's (Fashion-MNIST's Gaussian-COREL CNN stalls at the paper's 0.85: docs/reproduction.md).
EXTRA=
[ -n "${EXTRA_LAMS:-}" ] && EXTRA="--extra-lam $EXTRA_LAMS"
# shellcheck disable=SC2086  # DATASETS: names separated by spaces; CHECK, STACK, EXTRA: flags or nothing
COREL_CUDA_GRAPHS=$GRAPHS_OK "$PY" bench/cnn_rows.py launch --out "$OUT/rows.jsonl" --datasets ${DATASETS:-mnist fashion-mnist} $CHECK $STACK $EXTRA \
    --state "$STATE" --stop-after $(( $(left) - 45 )) >"$OUT/rows.txt" 2>&1 &
ROWS=$!
BIN=$(dirname "$(command -v "$PY")")
if command -v make >/dev/null && [ -x "$BIN/python" ]; then  # make test-gpu, without its venv
    # -o: neither the venv's install nor the native build (whose stamp needs the service's
    # install: on the H100 on 2026-11-26 make went to pip install it and failed there).
    timeout $(( $(left) - 20 )) make -o .venv/.installed -o .venv/.native-built test-gpu BIN="$BIN" \
        >"$OUT/test-gpu.txt" 2>&1
else  # the same command as make test-gpu's
    COREL_REQUIRE_CUDA=1 timeout $(( $(left) - 20 )) "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/gpu \
        >"$OUT/test-gpu.txt" 2>&1
fi
echo "make test-gpu: exit status $? at $(( $(date +%s) - T0 )) s"
wait $ROWS
echo "CNN rows done at $(( $(date +%s) - T0 )) s"
# Parts of at most 15 MiB, each small enough to keep in git beside the rows (docs/runs/).
if command -v xz >/dev/null; then
    tar -C "$STATE" -cf - . | xz -T0 -6 | split -b 15M -d - "$OUT/state.tar.xz."
else
    tar -C "$STATE" -cf - . | gzip -6 | split -b 15M -d - "$OUT/state.tar.gz."
fi
echo "state: $(ls "$OUT"/state.tar.* | wc -l) part(s), $(du -ch "$OUT"/state.tar.* | tail -1 | cut -f1)"
[ "$MPS_ON" = 1 ] && echo quit | nvidia-cuda-mps-control
[ "${BENCH:-1}" = after ] && benchmarks
tail -45 "$OUT/rows.txt"
tail -3 "$OUT/test-gpu.txt"
