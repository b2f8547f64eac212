#!/usr/bin/env bash
# The GPU machine (device tool) has no network and no omegaconf: carry its wheel.
#   here:  bash bench/device.sh wheels        # downloads into .whl/ (git-ignored via .git/info/exclude)
#   there: source bench/device.sh setup       # installs the carried wheels and tileinfer, no network
# Every device call names .whl in `carry` and starts with `source bench/device.sh setup`.
case "${1:-}" in
  wheels)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl omegaconf==2.4.0
    ls .whl ;;
  setup)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /tmp/pip-tileinfer.log 2>&1 \
      || { cat /tmp/pip-tileinfer.log; return 1 2>/dev/null || exit 1; }
    python3 -c 'import torch, triton, tileinfer; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' ;;
  *) echo "usage: bash bench/device.sh wheels | source bench/device.sh setup" >&2; exit 2 ;;
esac
