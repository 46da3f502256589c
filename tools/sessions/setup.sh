# Sourced by the session scripts on the device: R (results directory, tarred into the device's $OUT at the end
# as OUT_DEV/results.tgz), the one-time set-up of tools/device_session.sh, and the environment every step needs.
# Usage: R=/tmp/rN; source tools/sessions/setup.sh
mkdir -p "$R"
OUT_DEV=$OUT
OUT=$R bash tools/device_session.sh none > "$R/setup.log" 2>&1 || { tail -20 "$R/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site JAX_MOE_FFI_CUDA_LIB=$PWD/.gpu/libjax_moe_ffi_cuda.so PYTHONUNBUFFERED=1
export JMF_GIT_COMMIT=${JMF_GIT_COMMIT:-unknown}
