module @jit__lambda attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<256x16xf32>, %arg1: tensor<16x512x256xf32>, %arg2: tensor<16x256x512xf32>, %arg3: tensor<16x256x512xf32>, %arg4: tensor<512x256xf32>) -> (tensor<512x256xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.dot_general %arg4, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<512x256xf32>, tensor<256x16xf32>) -> tensor<512x16xf32>
    %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<512x16xf32>, tensor<f32>) -> tensor<512xf32>
    %cst_0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<512xf32>
    %3 = stablehlo.maximum %2, %1 : tensor<512xf32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [0] : (tensor<512xf32>) -> tensor<512x1xf32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [0, 1] : (tensor<512x1xf32>) -> tensor<512x16xf32>
    %6 = stablehlo.subtract %0, %5 : tensor<512x16xf32>
    %7 = stablehlo.exponential %6 : tensor<512x16xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %8 = stablehlo.reduce(%7 init: %cst_1) applies stablehlo.add across dimensions = [1] : (tensor<512x16xf32>, tensor<f32>) -> tensor<512xf32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [0] : (tensor<512xf32>) -> tensor<512x1xf32>
    %10 = stablehlo.broadcast_in_dim %9, dims = [0, 1] : (tensor<512x1xf32>) -> tensor<512x16xf32>
    %11 = stablehlo.divide %7, %10 : tensor<512x16xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %12 = "stablehlo.case"(%c) ({
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %13:2 = "stablehlo.case"(%12) ({
      %92:2 = stablehlo.custom_call @jax_moe_ffi_top_k(%11) {backend_config = "", mhlo.backend_config = {k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x16xf32>) -> (tensor<512x2xf32>, tensor<512x2xi32>)
      stablehlo.return %92#0, %92#1 : tensor<512x2xf32>, tensor<512x2xi32>
    }) : (tensor<i32>) -> (tensor<512x2xf32>, tensor<512x2xi32>)
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %14 = stablehlo.reduce(%13#0 init: %cst_2) applies stablehlo.add across dimensions = [1] : (tensor<512x2xf32>, tensor<f32>) -> tensor<512xf32>
    %15 = stablehlo.broadcast_in_dim %14, dims = [0] : (tensor<512xf32>) -> tensor<512x1xf32>
    %16 = stablehlo.broadcast_in_dim %15, dims = [0, 1] : (tensor<512x1xf32>) -> tensor<512x2xf32>
    %17 = stablehlo.divide %13#0, %16 : tensor<512x2xf32>
    %18 = stablehlo.broadcast_in_dim %13#1, dims = [0, 1] : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %19 = stablehlo.iota dim = 2 : tensor<1x1x16xi32>
    %20 = stablehlo.broadcast_in_dim %18, dims = [0, 1, 2] : (tensor<512x2x1xi32>) -> tensor<512x2x16xi32>
    %21 = stablehlo.broadcast_in_dim %19, dims = [0, 1, 2] : (tensor<1x1x16xi32>) -> tensor<512x2x16xi32>
    %22 = stablehlo.compare EQ, %20, %21, SIGNED : (tensor<512x2x16xi32>, tensor<512x2x16xi32>) -> tensor<512x2x16xi1>
    %23 = stablehlo.convert %22 : (tensor<512x2x16xi1>) -> tensor<512x2x16xf32>
    %24 = stablehlo.broadcast_in_dim %17, dims = [0, 1] : (tensor<512x2xf32>) -> tensor<512x2x1xf32>
    %25 = stablehlo.broadcast_in_dim %24, dims = [0, 1, 2] : (tensor<512x2x1xf32>) -> tensor<512x2x16xf32>
    %26 = stablehlo.multiply %23, %25 : tensor<512x2x16xf32>
    %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %27 = stablehlo.reduce(%26 init: %cst_3) applies stablehlo.add across dimensions = [1] : (tensor<512x2x16xf32>, tensor<f32>) -> tensor<512x16xf32>
    %28 = stablehlo.reshape %13#1 : (tensor<512x2xi32>) -> tensor<1024xi32>
    %29 = stablehlo.iota dim = 0 : tensor<1024xi32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %30 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %31 = stablehlo.compare LT, %29, %30, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_5 = stablehlo.constant dense<1024> : tensor<i32>
    %32 = stablehlo.broadcast_in_dim %c_5, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %33 = stablehlo.add %29, %32 : tensor<1024xi32>
    %34 = stablehlo.select %31, %33, %29 : tensor<1024xi1>, tensor<1024xi32>
    %35 = stablehlo.broadcast_in_dim %34, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %36 = "stablehlo.gather"(%28, %35) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xi32>, tensor<1024x1xi32>) -> tensor<1024xi32>
    %c_6 = stablehlo.constant dense<2> : tensor<i32>
    %37 = call @floor_divide(%29, %c_6) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_7 = stablehlo.constant dense<512> : tensor<i32>
    %38 = call @remainder(%37, %c_7) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_8 = stablehlo.constant dense<0> : tensor<i32>
    %c_9 = stablehlo.constant dense<511> : tensor<i32>
    %39 = call @clip(%38, %c_8, %c_9) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %c_11 = stablehlo.constant dense<15> : tensor<i32>
    %40 = call @clip(%36, %c_10, %c_11) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_12 = stablehlo.constant dense<0> : tensor<i32>
    %41 = stablehlo.broadcast_in_dim %c_12, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %42 = stablehlo.compare LT, %39, %41, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_13 = stablehlo.constant dense<512> : tensor<i32>
    %43 = stablehlo.broadcast_in_dim %c_13, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %44 = stablehlo.add %39, %43 : tensor<1024xi32>
    %45 = stablehlo.select %42, %44, %39 : tensor<1024xi1>, tensor<1024xi32>
    %c_14 = stablehlo.constant dense<0> : tensor<i32>
    %46 = stablehlo.broadcast_in_dim %c_14, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %47 = stablehlo.compare LT, %40, %46, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_15 = stablehlo.constant dense<16> : tensor<i32>
    %48 = stablehlo.broadcast_in_dim %c_15, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %49 = stablehlo.add %40, %48 : tensor<1024xi32>
    %50 = stablehlo.select %47, %49, %40 : tensor<1024xi1>, tensor<1024xi32>
    %51 = stablehlo.broadcast_in_dim %45, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %52 = stablehlo.broadcast_in_dim %50, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %53 = stablehlo.concatenate %51, %52, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %54 = "stablehlo.gather"(%27, %53) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<512x16xf32>, tensor<1024x2xi32>) -> tensor<1024xf32>
    %55 = stablehlo.reshape %54 : (tensor<1024xf32>) -> tensor<512x2xf32>
    %c_16 = stablehlo.constant dense<false> : tensor<i1>
    %56 = stablehlo.broadcast_in_dim %c_16, dims = [] : (tensor<i1>) -> tensor<0xi1>
    %c_17 = stablehlo.constant dense<0> : tensor<i32>
    %57 = "stablehlo.case"(%c_17) ({
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %58:4 = "stablehlo.case"(%57) ({
      %92:5 = stablehlo.custom_call @jax_moe_ffi_dispatch_plan(%13#1, %56) {backend_config = "", mhlo.backend_config = {align = 1 : i64, capacity = -1 : i64, chunk = 256 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>]} : (tensor<512x2xi32>, tensor<0xi1>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<81xi32>)
      stablehlo.return %92#0, %92#1, %92#2, %92#3 : tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>
    }) : (tensor<i32>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>)
    %cst_18 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %59 = stablehlo.broadcast_in_dim %cst_18, dims = [] : (tensor<f32>) -> tensor<0xf32>
    %c_19 = stablehlo.constant dense<0> : tensor<i32>
    %60 = "stablehlo.case"(%c_19) ({
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %61 = "stablehlo.case"(%60) ({
      %92 = stablehlo.custom_call @jax_moe_ffi_dispatch(%arg4, %58#0, %58#1, %59) {backend_config = "", mhlo.backend_config = {top_k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x256xf32>, tensor<512x2xi32>, tensor<1024xi32>, tensor<0xf32>) -> tensor<1024x256xf32>
      stablehlo.return %92 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %c_20 = stablehlo.constant dense<0> : tensor<i32>
    %62 = stablehlo.broadcast_in_dim %c_20, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %63 = stablehlo.compare GE, %58#1, %62, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %64 = stablehlo.reshape %55 : (tensor<512x2xf32>) -> tensor<1024xf32>
    %c_21 = stablehlo.constant dense<0> : tensor<i32>
    %65 = stablehlo.broadcast_in_dim %c_21, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %66 = stablehlo.maximum %58#1, %65 : tensor<1024xi32>
    %c_22 = stablehlo.constant dense<0> : tensor<i32>
    %67 = stablehlo.broadcast_in_dim %c_22, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %68 = stablehlo.compare LT, %66, %67, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_23 = stablehlo.constant dense<1024> : tensor<i32>
    %69 = stablehlo.broadcast_in_dim %c_23, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %70 = stablehlo.add %66, %69 : tensor<1024xi32>
    %71 = stablehlo.select %68, %70, %66 : tensor<1024xi1>, tensor<1024xi32>
    %72 = stablehlo.broadcast_in_dim %71, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %73 = "stablehlo.gather"(%64, %72) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xf32>, tensor<1024x1xi32>) -> tensor<1024xf32>
    %cst_24 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %74 = call @_where_1(%63, %73, %cst_24) : (tensor<1024xi1>, tensor<1024xf32>, tensor<f32>) -> tensor<1024xf32>
    %c_25 = stablehlo.constant dense<0> : tensor<i32>
    %75 = "stablehlo.case"(%c_25) ({
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %76:2 = "stablehlo.case"(%75) ({
      %92 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%61, %arg2, %58#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      %93 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%61, %arg3, %58#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      stablehlo.return %92, %93 : tensor<1024x512xf32>, tensor<1024x512xf32>
    }) : (tensor<i32>) -> (tensor<1024x512xf32>, tensor<1024x512xf32>)
    %77 = stablehlo.negate %76#0 : tensor<1024x512xf32>
    %78 = stablehlo.exponential %77 : tensor<1024x512xf32>
    %cst_26 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %79 = stablehlo.broadcast_in_dim %cst_26, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %80 = stablehlo.add %79, %78 : tensor<1024x512xf32>
    %cst_27 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %81 = stablehlo.broadcast_in_dim %cst_27, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %82 = stablehlo.divide %81, %80 : tensor<1024x512xf32>
    %83 = stablehlo.multiply %76#0, %82 : tensor<1024x512xf32>
    %84 = stablehlo.multiply %83, %76#1 : tensor<1024x512xf32>
    %85 = stablehlo.broadcast_in_dim %74, dims = [0] : (tensor<1024xf32>) -> tensor<1024x1xf32>
    %86 = stablehlo.broadcast_in_dim %85, dims = [0, 1] : (tensor<1024x1xf32>) -> tensor<1024x512xf32>
    %87 = stablehlo.multiply %84, %86 : tensor<1024x512xf32>
    %c_28 = stablehlo.constant dense<0> : tensor<i32>
    %88 = "stablehlo.case"(%c_28) ({
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %89 = "stablehlo.case"(%88) ({
      %92 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%87, %arg1, %58#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x512xf32>, tensor<16x512x256xf32>, tensor<16xi32>) -> tensor<1024x256xf32>
      stablehlo.return %92 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %90 = call @compute_on(%58#0, %58#1, %58#2, %58#3, %89) {mhlo.frontend_attributes = {_xla_stream_annotation = "2", inlineable = "false"}} : (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<1024x256xf32>) -> tensor<512x256xf32>
    %91 = stablehlo.custom_call @annotate_device_placement(%90) {backend_config = "", has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<512x256xf32>) -> tensor<512x256xf32>
    return %91 : tensor<512x256xf32>
  }
  func.func private @floor_divide(%arg0: tensor<1024xi32>, %arg1: tensor<i32>) -> tensor<1024xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %2 = stablehlo.divide %arg0, %1 : tensor<1024xi32>
    %3 = stablehlo.sign %arg0 : tensor<1024xi32>
    %4 = stablehlo.sign %0 : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %6 = stablehlo.compare NE, %3, %5, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %7 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %8 = stablehlo.remainder %arg0, %7 : tensor<1024xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %10 = stablehlo.compare NE, %8, %9, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %11 = stablehlo.and %6, %10 : tensor<1024xi1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %12 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %13 = stablehlo.subtract %2, %12 : tensor<1024xi32>
    %14 = call @_where(%11, %13, %2) : (tensor<1024xi1>, tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi32>
    return %14 : tensor<1024xi32>
  }
  func.func private @_where(%arg0: tensor<1024xi1>, %arg1: tensor<1024xi32>, %arg2: tensor<1024xi32>) -> tensor<1024xi32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<1024xi1>, tensor<1024xi32>
    return %0 : tensor<1024xi32>
  }
  func.func private @remainder(%arg0: tensor<1024xi32>, %arg1: tensor<i32>) -> tensor<1024xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where_0(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %4 = stablehlo.remainder %arg0, %3 : tensor<1024xi32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %c_1, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %6 = stablehlo.compare NE, %4, %5, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %7 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %8 = stablehlo.compare LT, %4, %7, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %10 = stablehlo.broadcast_in_dim %9, dims = [] : (tensor<i1>) -> tensor<1024xi1>
    %11 = stablehlo.compare NE, %8, %10, UNSIGNED : (tensor<1024xi1>, tensor<1024xi1>) -> tensor<1024xi1>
    %12 = stablehlo.and %11, %6 : tensor<1024xi1>
    %13 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %14 = stablehlo.add %4, %13 : tensor<1024xi32>
    %15 = stablehlo.select %12, %14, %4 : tensor<1024xi1>, tensor<1024xi32>
    return %15 : tensor<1024xi32>
  }
  func.func private @_where_0(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @clip(%arg0: tensor<1024xi32>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<1024xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %2 = stablehlo.maximum %1, %arg0 : tensor<1024xi32>
    %3 = stablehlo.convert %arg2 : tensor<i32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %5 = stablehlo.minimum %4, %2 : tensor<1024xi32>
    return %5 : tensor<1024xi32>
  }
  func.func private @_where_1(%arg0: tensor<1024xi1>, %arg1: tensor<1024xf32>, %arg2: tensor<f32>) -> tensor<1024xf32> {
    %0 = stablehlo.convert %arg2 : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<1024xf32>
    %2 = stablehlo.select %arg0, %arg1, %1 : tensor<1024xi1>, tensor<1024xf32>
    return %2 : tensor<1024xf32>
  }
  func.func private @compute_on(%arg0: tensor<512x2xi32>, %arg1: tensor<1024xi32>, %arg2: tensor<16xi32>, %arg3: tensor<16xi32>, %arg4: tensor<1024x256xf32>) -> tensor<512x256xf32> {
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<512x2xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = "stablehlo.case"(%c) ({
      %c_0 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_0 : tensor<i32>
    }, {
      %c_0 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_0 : tensor<i32>
    }, {
      %c_0 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_0 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %2 = "stablehlo.case"(%1) ({
      %3 = stablehlo.custom_call @jax_moe_ffi_combine(%arg4, %arg0, %0) {backend_config = "", mhlo.backend_config = {}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<512x2xi32>, tensor<512x2xf32>) -> tensor<512x256xf32>
      stablehlo.return %3 : tensor<512x256xf32>
    }) : (tensor<i32>) -> tensor<512x256xf32>
    return %2 : tensor<512x256xf32>
  }
}
