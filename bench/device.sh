#!/usr/bin/env bash
# The GPU machine (device tool) has no network and no omegaconf: carry its wheel, the INT8 peers'
# packages (torchao 0.18.0's abi3 wheel, gemlite 0.6.0.post2's sdist: pure Python/Triton), and
# pytest-xdist with execnet (the GPU tests over several processes: python -m bench gpu-tests), xgrammar with
# what it needs (structured outputs: bench check json) and jsonschema with its needs (the structured-output tests).
#   here:  bash bench/device.sh wheels        # downloads into .whl/ (git-ignored via .git/info/exclude)
#   there: source bench/device.sh setup       # installs the carried wheels and tileinfer, no network
# Every device call names .whl in `carry` and starts with `source bench/device.sh setup`, then runs
# `python3 -m bench ...` (python -m bench --help lists the calls). All of
# .whl is about 12 MB (torchao 3.4, tvm-ffi 3.3, pydantic-core 2.3, xgrammar 1.4, the rest under 1); a call carries
# 64 MiB in all.
# A peer package that does not install there is a notice, not a failure: its rows then record why.
case "${1:-}" in
  wheels)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl omegaconf==2.4.0 torchao==0.18.0 pytest-xdist==3.8.0 execnet==2.1.1 \
      xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
      typing-inspection==0.4.5 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
      rpds-py==2026.9.1 attrs==26.1.0
    python3 -m pip download -q --no-deps --no-binary :all: -d .whl gemlite==0.6.0.post2
    ls -l .whl && du -sh .whl ;;
  setup)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    for sdist in .whl/*.tar.gz; do  # gemlite: built there, against the machine's own setuptools
      [[ -e $sdist ]] || continue
      python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site "$sdist" \
        > /tmp/pip-sdist.log 2>&1 && continue
      # a setuptools without bdist_wheel cannot build it; the package is pure Python: unpack it
      pkg=$(basename "$sdist" .tar.gz)
      tar xzf "$sdist" -C /tmp/site --strip-components=1 "$pkg/${pkg%%-*}" 2>/dev/null \
        && echo "notice: $sdist unpacked into /tmp/site (pip could not build it: /tmp/pip-sdist.log)" \
        || echo "notice: $sdist did not install: $(tail -1 /tmp/pip-sdist.log)"
    done
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /tmp/pip-tileinfer.log 2>&1 \
      || { cat /tmp/pip-tileinfer.log; return 1 2>/dev/null || exit 1; }
    python3 -c 'import torch, triton, tileinfer; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' ;;
  *) echo "usage: bash bench/device.sh wheels | source bench/device.sh setup" >&2; exit 2 ;;
esac
