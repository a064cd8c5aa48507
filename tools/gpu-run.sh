#!/bin/sh
# Runs loom's CUDA checks on a GPU machine that has the CUDA 13 toolkit and PyTorch (with its
# cuDNN) but no Debian packages, such as the H100 some development sessions are lent.
#
#   tools/gpu-run.sh pack            here, after building in build/: bundles the CUDA test
#                                    binaries, loom_bench and the recipes with the Debian
#                                    libraries they load, and data/*.h5 (setup.sh's datasets),
#                                    into .gpu/bundle.tar.xz (ignored by git)
#   tools/gpu-run.sh run [ctest-args]  there, in the repository root: unpacks the bundle,
#                                    points the loader at it and at PyTorch's cuDNN, prints
#                                    the GPU, then runs the CUDA suite (Cuda.*, by default)
#   tools/gpu-run.sh bench [args]    there: unpacks likewise, then loom against PyTorch on the
#                                    GPU, bench/vs_pytorch.py --device cuda [args] (e.g.
#                                    --models resnet20 --tf32 --repeat 2) with the bundle's
#                                    loom_bench and the python3 on PATH (it has torch); the raw
#                                    tables and the comparison go to $OUT/bench/ when $OUT is set
#   tools/gpu-run.sh exec CMD [args] there: unpacks likewise, then runs CMD with the bundle's
#                                    binaries (loom_bench, the test binaries, the recipes) first
#                                    on PATH; data/ gets the bundle's datasets where it has none
#   tools/gpu-run.sh train [args]    there: train_resnet --device cuda [args] on the bundle's
#                                    Fashion-MNIST (e.g. --epochs 5); the log goes to
#                                    $OUT/train_resnet.log too when $OUT is set
#   tools/gpu-run.sh all [args]      there: the CUDA suite (default filter), then the benchmark
#                                    with [args], even if the suite failed; non-zero if either failed
#   tools/gpu-run.sh ab [args]       there: loom_bench's training rows (captured) with each of the
#                                    switches below off and on, twice in turn, so that one call
#                                    says what each is worth on the GPU: LOOM_CUDNN_ALGOS=timed
#                                    (first, so a cut-short call still has it), LOOM_CUDA_VECTOR,
#                                    LOOM_RECOMPUTE_COSTLY, LOOM_CUDNN_ALGOS=deterministic
#                                    (README, environment variables). [args] replace the default loom_bench
#                                    arguments; the rows also go to $OUT/ab.txt when $OUT is set
#   tools/gpu-run.sh ab-infer [args] there: loom_bench's batch-1 inference rows (lazy, captured)
#                                    with LOOM_CONV_IM2COL at its default (small_output: every
#                                    conv of the evaluation as a GEMM), off and tiny_plane (the
#                                    256- and 512-channel stages' only), twice in turn;
#                                    [args] are added (e.g. --models resnet18); the rows also go
#                                    to $OUT/ab_infer.txt. LOOM_GPU_ROUNDS=N sets the rounds of
#                                    both ab modes (default 2)
#   tools/gpu-run.sh profile [MODEL [PRECISION [BATCH]]]
#                                    there: where one training step's GPU time goes, on both
#                                    sides (default resnet18 fp32 256): loom_bench --profile over
#                                    6 captured steps, summed per op by
#                                    recipes/profile_summary.py --by-op, then pytorch_steps.py
#                                    --profile (torch.profiler's table of the ops' self times);
#                                    all under $OUT/profile/ (else /tmp/loom-profile/)
#   tools/gpu-run.sh checks [args]   there: a whole lease's checklist in one call, in this order,
#                                    each step under its own time limit so that a slow one leaves
#                                    the next their time: the CUDA suite (less
#                                    cuda_codegen_test, which needs no GPU and runs in ctest),
#                                    ab-infer, ab (one round), then bench [args] (default:
#                                    --models resnet18 --modes captured --no-host --repeat 1).
#                                    LOOM_GPU_LIMITS="suite infer ab bench" sets the limits in
#                                    seconds (default "140 110 130 180", 560 in all: one call
#                                    of 600 s). Each step's status and time are
#                                    printed last, and everything under $OUT is also packed
#                                    into $OUT/checks.tar.gz (the tool brings back 8 files)
#
# With the device tool: run `tools/gpu-run.sh pack`, then a run whose command is
# `tools/gpu-run.sh run` (or `bench ...`, or `all ...`) with carry [".gpu"]. Nothing is
# downloaded on either side. One call may run 10 minutes: the benchmark's progress lines say
# how long each side took, so a call can take one model (--models) at a time.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$root/.gpu/bundle.tar.xz

pack() {
  build=$root/build
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" "$root/.gpu"
  # Ignored by git, so that the bundle travels only where it is carried.
  exclude=$(git -C "$root" rev-parse --git-path info/exclude)
  case $exclude in /*) ;; *) exclude=$root/$exclude ;; esac
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
  for b in tests/cuda_device_test tests/cuda_codegen_test tests/ops_forward_test tests/models_test \
           bench/loom_bench recipes/train_resnet recipes/train_decoder; do
    [ -x "$build/$b" ] || { echo "gpu-run.sh: $build/$b not built (make -C build)" >&2; exit 1; }
    strip -o "$stage/bin/$(basename "$b")" "$build/$b"
    # The Debian libraries it loads; glibc and the CUDA libraries are the machine's own.
    ldd "$build/$b" | awk '/=> \// {print $3}' |
      grep -v -e '/libc\.so' -e '/libm\.so' -e '/libpthread' -e '/libdl\.so' -e '/librt\.so' \
              -e '/ld-linux' -e '/usr/local/cuda' -e 'libcud' -e 'libcublas' -e 'libnvrtc' |
      while read -r lib; do cp -Ln "$lib" "$stage/lib/" 2>/dev/null || true; done
  done
  # The tests read their fixtures from the source tree they were built in: recorded, so that
  # `run` can put this checkout at that path.
  echo "$root" >"$stage/srcdir"
  # The recipes' datasets, as setup.sh wrote them (the GPU machine has no Debian packages).
  mkdir -p "$stage/data"
  for d in fashion_mnist.h5 fortunes.h5; do
    [ -f "$root/data/$d" ] || { echo "gpu-run.sh: no data/$d (run ./setup.sh here)" >&2; exit 1; }
    cp "$root/data/$d" "$stage/data/"
  done
  tar -C "$stage" -cJf "$bundle" bin lib srcdir data
  rm -rf "$stage"
  echo "gpu-run.sh: $(du -h "$bundle" | cut -f1) in $bundle"
}

# Unpacks the bundle into $dir and sets up the environment the binaries run in (once per
# process; a later process finds the same bundle unpacked, by its size and time, and keeps it).
dir=/tmp/loom-gpu
unpacked=0
unpack() {
  [ "$unpacked" = 1 ] && return 0
  [ -f "$bundle" ] || { echo "gpu-run.sh: no $bundle: run 'tools/gpu-run.sh pack' here first" >&2; exit 1; }
  stamp=$(stat -c '%s %Y' "$bundle")
  if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    if ! tar -C "$dir" -xJf "$bundle"; then echo "gpu-run.sh: cannot unpack $bundle into $dir" >&2; exit 1; fi
    echo "$stamp" >"$dir/.stamp"
  fi
  mkdir -p "$root/data"
  for f in "$dir"/data/*.h5; do  # a link left by an earlier unpack is renewed; a file is kept
    t=$root/data/$(basename "$f")
    if [ ! -e "$t" ] || [ -L "$t" ]; then ln -sfn "$f" "$t"; fi
  done
  src=$(cat "$dir/srcdir")
  if [ "$src" != "$root" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi
  cudnn=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], "lib"))' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$dir/lib:${cudnn}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export LOOM_CUDA_CACHE_DIR=/tmp/loom-kernel-cache OMP_WAIT_POLICY=passive
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  unpacked=1
}

# The CUDA suite; its exit status (0: every binary passed).
suite() {
  unpack
  status=0
  log=/dev/null
  if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/suite"; log=$OUT/suite; fi
  # Each binary under a time limit (LOOM_GPU_TEST_TIMEOUT seconds, 240 by default), so that
  # one hang leaves the others' results; each one's whole output also goes to $OUT/suite/.
  limit=${LOOM_GPU_TEST_TIMEOUT:-240}
  (
    cd "$dir/bin"
    s=0
    one() {
      name=$1
      shift
      echo "== $name"
      if [ "$log" = /dev/null ]; then timeout "$limit" "$@"; else
        timeout "$limit" "$@" >"$log/$name.log" 2>&1; r=$?; tail -n 25 "$log/$name.log"; return $r
      fi
    }
    one device ./cuda_device_test "$@" || s=$?
    (export LOOM_TEST_DEVICE=cuda
     one ops ./ops_forward_test --gtest_filter='Ops/OpCaseTest.*' --gtest_brief=1) || s=$?
    (export LOOM_TEST_DEVICE=cuda
     one models ./models_test --gtest_filter='Models/TrainingReference.*' --gtest_brief=1) || s=$?
    # Again with cuDNN's timed search choosing the convs' algorithms (ctest's
    # Cuda.TimedConvAlgorithms): a search that failed and fell back to the ranking fails it.
    (export LOOM_TEST_DEVICE=cuda LOOM_CUDNN_ALGOS=timed
     one timed sh -c 'out=$(./models_test --gtest_filter="Models/TrainingReference.*" \
                                           --gtest_brief=1 2>&1); r=$?; printf "%s\n" "$out"
                      if printf "%s" "$out" | grep -q "timed search of algorithms failed"; then
                        exit 1; fi; exit $r') || s=$?
    # NVRTC and the emulated kernels need no GPU (ctest runs them everywhere): checks skips them.
    if [ "${LOOM_GPU_CODEGEN:-1}" != 0 ]; then one codegen ./cuda_codegen_test --gtest_brief=1 || s=$?; fi
    exit $s
  ) || status=$?
  return $status
}

# loom against PyTorch (bench/vs_pytorch.py, from this checkout; loom_bench from the bundle).
bench() {
  unpack
  save=
  [ -n "${OUT:-}" ] && save="--save $OUT/bench"
  # shellcheck disable=SC2086  # $save is empty or two words
  python3 "$root/bench/vs_pytorch.py" --device cuda --loom-bench "$dir/bin/loom_bench" $save "$@"
}

# loom_bench with each switch at its default and at its other value, twice in turn.
# rows SECTION SETTING [loom_bench args]: loom_bench's rows of SECTION with the environment
# setting SETTING (or none: default), also appended to $out; $round names the round.
rows() {
  section=$1 setting=$2
  shift 2
  echo "== round $round: $section, $setting" | tee -a "$out"
  if [ "$setting" = default ]; then
    "$dir/bin/loom_bench" "$@" 2>/dev/null | grep "^$section" | tee -a "$out"
  else
    env "$setting" "$dir/bin/loom_bench" "$@" 2>/dev/null | grep "^$section" | tee -a "$out"
  fi
}

ab() {
  unpack
  [ $# -gt 0 ] || set -- --device cuda --sections train --models resnet18,decoder --modes captured \
                          --precision fp32,bf16 --batch resnet18=256,decoder=64 --steps 10
  out=/dev/null
  [ -n "${OUT:-}" ] && mkdir -p "$OUT" && out=$OUT/ab.txt
  for round in $(seq "${LOOM_GPU_ROUNDS:-2}"); do
    for setting in default LOOM_CUDNN_ALGOS=timed LOOM_CUDA_VECTOR=0 LOOM_RECOMPUTE_COSTLY=0 \
                   LOOM_CUDNN_ALGOS=deterministic; do
      rows train "$setting" "$@"
    done
  done
}

# Batch-1 inference (issue 16's captured/lazy rows): every conv of the evaluation as one GEMM
# (the default), none, and the tiny-plane convs only.
ab_infer() {
  unpack
  out=/dev/null
  [ -n "${OUT:-}" ] && mkdir -p "$OUT" && out=$OUT/ab_infer.txt
  for round in $(seq "${LOOM_GPU_ROUNDS:-2}"); do
    for setting in default LOOM_CONV_IM2COL=off LOOM_CONV_IM2COL=tiny_plane; do
      rows infer "$setting" --device cuda --sections infer "$@"
    done
  done
}

# One step's GPU time per op, loom's and PyTorch's, for one model, precision and batch.
profile() {
  unpack
  model=${1:-resnet18} precision=${2:-fp32} batch=${3:-256}
  case $precision in fp32) only= ;; bf16) only=--bf16-only ;;
    *) echo "gpu-run.sh profile: precision '$precision': expected fp32 or bf16" >&2; return 2 ;; esac
  out=${OUT:-/tmp/loom-profile}/profile
  mkdir -p "$out"
  echo "== loom: $model $precision batch $batch, 8 captured steps profiled (6 timed)"
  "$dir/bin/loom_bench" --device cuda --sections train --models "$model" --modes captured \
    --precision "$precision" --batch "$model=$batch" --steps 6 --profile "$out/loom.json" 2>/dev/null |
    grep '^train'
  # 8 steps traced: 2 chunks of 3 timed steps, each after an untimed one (bench/training_steps.cpp).
  python3 "$root/recipes/profile_summary.py" "$out/loom.json" --steps 8 --by-op --top 40 |
    tee "$out/loom_ops.txt"
  echo "== PyTorch: $model $precision batch $batch, eager, 3 steps profiled"
  # shellcheck disable=SC2086  # $only is empty or one word
  python3 "$root/bench/pytorch_steps.py" --device cuda --models "$model" --batch "$model=$batch" \
    --threads "$(nproc)" $only --profile "$out" | tail -n 3
  for f in "$out/$model"-*.txt; do head -n 45 "$f"; done
}

# The checklist: each step a process of this script under `timeout` (which ends the step's
# whole process group), its status and time kept for the summary.
checks() {
  unpack
  # shellcheck disable=SC2086  # four numbers
  set -- ${LOOM_GPU_LIMITS:-140 110 130 180} "$@"
  l_suite=$1 l_infer=$2 l_ab=$3 l_bench=$4
  shift 4
  [ $# -gt 0 ] || set -- --models resnet18 --modes captured --no-host --repeat 1
  summary=
  step() {
    name=$1 limit=$2
    shift 2
    echo "==== $name (at most ${limit} s)"
    t=$(date +%s)
    r=0
    timeout "$limit" "$@" || r=$?
    d=$(($(date +%s) - t))
    case $r in 0) what=passed ;; 124) what="stopped at its limit" ;; *) what="failed ($r)" ;; esac
    summary="$summary$name: $what, $d s
"
  }
  self=$root/tools/gpu-run.sh
  step suite "$l_suite" env LOOM_GPU_CODEGEN=0 "$self" run
  step ab-infer "$l_infer" "$self" ab-infer
  step ab "$l_ab" env LOOM_GPU_ROUNDS=1 "$self" ab
  step bench "$l_bench" "$self" bench "$@"
  if [ -n "${OUT:-}" ]; then
    (cd "$OUT" && tar -czf /tmp/checks.tar.gz . && mv /tmp/checks.tar.gz "$OUT/")
  fi
  echo "==== summary"
  printf '%s' "$summary"
  case $summary in *failed*|*stopped*) return 1 ;; esac
}

case "${1:-}" in
  pack) pack ;;
  checks) shift; checks "$@" || exit $? ;;
  profile) shift; profile "$@" || exit $? ;;
  ab) shift; ab "$@" ;;
  ab-infer) shift; ab_infer "$@" ;;
  run) shift; suite "$@" || exit $? ;;
  bench) shift; bench "$@" || exit $? ;;
  exec) shift; unpack; PATH="$dir/bin:$PATH" "$@" ;;
  train)
    shift
    unpack
    if [ -n "${OUT:-}" ]; then
      # The exit status is train_resnet's, not tee's.
      rm -f "$dir/train.rc"
      {
        r=0
        "$dir/bin/train_resnet" --device cuda "$@" 2>&1 || r=$?
        echo "$r" >"$dir/train.rc"
      } | tee "$OUT/train_resnet.log"
      exit "$(cat "$dir/train.rc")"
    fi
    "$dir/bin/train_resnet" --device cuda "$@" ;;
  all)
    shift
    s=0
    suite || s=$?
    bench "$@" || s=1
    exit $s ;;
  *) echo "usage: tools/gpu-run.sh pack | run [gtest-args] | bench [vs_pytorch.py args]" \
          "| exec CMD [args] | train [train_resnet args] | all [vs_pytorch.py args]" \
          "| ab [loom_bench args] | ab-infer [loom_bench args] | checks [vs_pytorch.py args]" \
          "| profile [model [precision [batch]]]" >&2
     exit 2 ;;
esac
