"""One module per op family: argument checks, ffi_call, custom_vjp."""
