#!/usr/bin/env bash
# The GPU checks of one lent machine, in one run: the cuda suite, the declared cost model measured
# there, where a large-C call spends its time, and the large-C benchmark on CUDA. Runs under the
# machine's own python3 and packages (probust from this tree on PYTHONPATH, nothing installed).
# Logs and JSON go to $OUT; STEPS picks the parts (default: all).
#
#   OUT=/tmp/cuda-check [STEPS="suite cost profile imagenet"] [IMAGENET_ARGS="--models vit ..."] \
#       bash benchmarks/cuda_check.sh
set -u
OUT=${OUT:-/tmp/cuda-check}
STEPS=${STEPS:-suite cost profile imagenet}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/benchmarks:$PWD PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, numpy, scipy; print('torch', torch.__version__, 'numpy', numpy.__version__, 'scipy', scipy.__version__, torch.cuda.get_device_name())"
    nproc
} 2>&1 | tee "$OUT/env.log"
case " $STEPS " in *" suite "*)
    timeout "${SUITE_S:-200}" python3 -m pytest -m cuda tests/cuda -p no:cacheprovider -q --durations=10 2>&1 \
        | tee "$OUT/cuda.log" ;;
esac
case " $STEPS " in *" cost "*)
    timeout 90 python3 benchmarks/bench_cost_model.py --device cuda --rows 1 16 --json "$OUT/cost_model.json" 2>&1 \
        | grep -v Warning | tee "$OUT/cost_model.log" ;;
esac
case " $STEPS " in *" profile "*)
    for method in taylor mmse; do
        timeout 60 python3 benchmarks/profile_call.py --device cuda --model resnet50 --method "$method" 2>&1 \
            | grep -v Warning | tee "$OUT/profile_$method.log"
    done ;;
esac
case " $STEPS " in *" imagenet "*)
    # shellcheck disable=SC2086
    timeout "${BENCH_S:-180}" python3 benchmarks/bench_imagenet.py --device cuda \
        ${IMAGENET_ARGS:---models resnet18 resnet50 --heads trained --methods taylor mmse --alone head spectral sketch} \
        --first-use --json "$OUT/imagenet.json" 2>&1 \
        | grep -v "Warning\|^  [^ ]" | tee "$OUT/imagenet.log" ;;
esac
