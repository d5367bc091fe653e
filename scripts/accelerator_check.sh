#!/usr/bin/env bash
# The checks that need an accelerator, as one short script (a few minutes on one GPU): the
# accelerator-marked tests (engines, generation and a fit on CUDA against the CPU), then the sweep
# benchmark's mid-size table on the CPU and on the GPU side by side. It installs nothing: run it
# in an environment whose torch is a CUDA build, with the project installed (pip install -e .[test]).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device visible"; print(torch.cuda.get_device_name(0))'
"$PY" -m pytest -q -m accelerator tests/test_accelerator.py -rs
"$PY" benchmarks/sweep.py --sizes mid --devices cpu,cuda --quick
