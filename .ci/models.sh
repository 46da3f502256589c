#!/usr/bin/env bash
# Third-party model group (tests/models): keras-hub (JAX backend) and MaxText RoutedMoE through
# jax_moe_ffi.optimize / explain. Own venv on Python 3.12 (MaxText needs >= 3.12), jax pinned by
# tests/models/constraints.txt; no weights or data are downloaded, tiny configs on the CPU.
#   JMF_MODELS_PYTHON  python >= 3.12 to build the venv from (default: pyenv's 3.12.1, else python3.12)
#   JMF_MODELS_VENV    venv path (default /tmp/jmf-models-venv, recreated each run)
set -euo pipefail
cd "$(dirname "$0")/.."
export KERAS_BACKEND=jax
t0=$(date +%s)
last=$t0
stamp() { local now; now=$(date +%s); echo "models.sh: $1: $((now - last)) s (total $((now - t0)) s)"; last=$now; }

py=${JMF_MODELS_PYTHON:-}
if [ -z "$py" ]; then
  if command -v pyenv >/dev/null 2>&1 && [ -x "$(pyenv root)/versions/3.12.1/bin/python" ]; then
    py="$(pyenv root)/versions/3.12.1/bin/python"
  elif command -v python3.12 >/dev/null 2>&1; then
    py=$(command -v python3.12)
  else
    echo "models.sh: no Python 3.12 found (MaxText needs >= 3.12); set JMF_MODELS_PYTHON" >&2
    exit 1
  fi
fi
venv=${JMF_MODELS_VENV:-/tmp/jmf-models-venv}
build=/tmp/jmf-models-build
rm -rf "$venv" "$build"
"$py" -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
# jax/jaxlib pinned for every install below (the H200 runs 0.11.2; MaxText 0.2.5 wants >= 0.11.1)
export PIP_CONSTRAINT="$PWD/tests/models/constraints.txt"
stamp "venv ($(python --version))"

# The CPU extension must be built against the jaxlib it runs with (XLA FFI API version): build without
# isolation, inside this venv, so the pinned jaxlib's headers are used (an isolated build takes the newest).
pip install -q scikit-build-core nanobind cmake ninja jax jaxlib
pip install -q --no-build-isolation -C build-dir="$build/{wheel_tag}" -e ".[test,models]"
stamp "jax_moe_ffi built + test/models extras installed"

# keras-hub and maxtext without their declared requirements: keras-hub's pull in TensorFlow (not needed with
# the JAX backend), maxtext declares its own only in heavy extras; the import-time ones are in the models extra.
pip install -q --no-deps "keras-hub==${JMF_KERAS_HUB_VERSION:-0.32.0}" "maxtext==${JMF_MAXTEXT_VERSION:-0.2.5}"
python -c "import jax, keras, keras_hub, maxtext; print('models.sh: jax', jax.__version__, '| keras', keras.__version__, '| keras_hub', keras_hub.__version__, '| maxtext', maxtext.__version__)" 2>&1 | grep '^models.sh'
stamp "keras-hub + maxtext installed"

set +e
JMF_MODELS_REQUIRED=1 python -m pytest -q -rfExX --durations=8 -p no:cacheprovider tests/models
rc=$?
set -e
stamp "pytest tests/models"
if [ "$rc" -eq 5 ]; then echo "models.sh: pytest collected no tests"; exit 1; fi
# The pass on the jaxpr structures whose parameters change between jax releases (scan / fori_loop / while / cond /
# remat / shard_map: jax 0.11's scan replaced num_consts / num_carry by a flat tree, which broke the rolled-loop
# reading until session 33; ir.assemble_top1 traces its equations with the installed jax): the main tests run
# jax 0.10 (Python 3.11), this venv the H200's 0.11.2. ~3 min.
python -m pytest -q -p no:cacheprovider tests/test_rewrite.py tests/test_pass_runtime.py tests/test_rewrite_outer_router.py \
  tests/test_rewrite_repeating_ids.py \
  -k "scan or fori or rolled or while or cond or checkpoint or shard_map or remat or map or outside or separate" || rc=1
stamp "pytest pass structures on jax $(python -c 'import jax; print(jax.__version__)')"
echo "models.sh: done in $(( $(date +%s) - t0 )) s (rc=$rc)"
exit "$rc"
