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
    %values, %indices = chlo.top_k(%11, k = 2) : tensor<512x16xf32> -> (tensor<512x2xf32>, tensor<512x2xi32>)
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %12 = stablehlo.reduce(%values init: %cst_2) applies stablehlo.add across dimensions = [1] : (tensor<512x2xf32>, tensor<f32>) -> tensor<512xf32>
    %13 = stablehlo.broadcast_in_dim %12, dims = [0] : (tensor<512xf32>) -> tensor<512x1xf32>
    %14 = stablehlo.broadcast_in_dim %13, dims = [0, 1] : (tensor<512x1xf32>) -> tensor<512x2xf32>
    %15 = stablehlo.divide %values, %14 : tensor<512x2xf32>
    %16 = stablehlo.broadcast_in_dim %indices, dims = [0, 1] : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %17 = stablehlo.iota dim = 2 : tensor<1x1x16xi32>
    %18 = stablehlo.broadcast_in_dim %16, dims = [0, 1, 2] : (tensor<512x2x1xi32>) -> tensor<512x2x16xi32>
    %19 = stablehlo.broadcast_in_dim %17, dims = [0, 1, 2] : (tensor<1x1x16xi32>) -> tensor<512x2x16xi32>
    %20 = stablehlo.compare EQ, %18, %19, SIGNED : (tensor<512x2x16xi32>, tensor<512x2x16xi32>) -> tensor<512x2x16xi1>
    %21 = stablehlo.convert %20 : (tensor<512x2x16xi1>) -> tensor<512x2x16xf32>
    %22 = stablehlo.broadcast_in_dim %15, dims = [0, 1] : (tensor<512x2xf32>) -> tensor<512x2x1xf32>
    %23 = stablehlo.broadcast_in_dim %22, dims = [0, 1, 2] : (tensor<512x2x1xf32>) -> tensor<512x2x16xf32>
    %24 = stablehlo.multiply %21, %23 : tensor<512x2x16xf32>
    %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %25 = stablehlo.reduce(%24 init: %cst_3) applies stablehlo.add across dimensions = [1] : (tensor<512x2x16xf32>, tensor<f32>) -> tensor<512x16xf32>
    %26 = stablehlo.reshape %indices : (tensor<512x2xi32>) -> tensor<1024xi32>
    %27 = stablehlo.iota dim = 0 : tensor<1024xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %28 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %29 = stablehlo.compare LT, %27, %28, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_4 = stablehlo.constant dense<1024> : tensor<i32>
    %30 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %31 = stablehlo.add %27, %30 : tensor<1024xi32>
    %32 = stablehlo.select %29, %31, %27 : tensor<1024xi1>, tensor<1024xi32>
    %33 = stablehlo.broadcast_in_dim %32, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %34 = "stablehlo.gather"(%26, %33) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xi32>, tensor<1024x1xi32>) -> tensor<1024xi32>
    %c_5 = stablehlo.constant dense<2> : tensor<i32>
    %35 = call @floor_divide(%27, %c_5) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_6 = stablehlo.constant dense<512> : tensor<i32>
    %36 = call @remainder(%35, %c_6) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_7 = stablehlo.constant dense<0> : tensor<i32>
    %c_8 = stablehlo.constant dense<511> : tensor<i32>
    %37 = call @clip(%36, %c_7, %c_8) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_9 = stablehlo.constant dense<0> : tensor<i32>
    %c_10 = stablehlo.constant dense<15> : tensor<i32>
    %38 = call @clip(%34, %c_9, %c_10) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_11 = stablehlo.constant dense<0> : tensor<i32>
    %39 = stablehlo.broadcast_in_dim %c_11, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %40 = stablehlo.compare LT, %37, %39, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_12 = stablehlo.constant dense<512> : tensor<i32>
    %41 = stablehlo.broadcast_in_dim %c_12, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %42 = stablehlo.add %37, %41 : tensor<1024xi32>
    %43 = stablehlo.select %40, %42, %37 : tensor<1024xi1>, tensor<1024xi32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %44 = stablehlo.broadcast_in_dim %c_13, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %45 = stablehlo.compare LT, %38, %44, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_14 = stablehlo.constant dense<16> : tensor<i32>
    %46 = stablehlo.broadcast_in_dim %c_14, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %47 = stablehlo.add %38, %46 : tensor<1024xi32>
    %48 = stablehlo.select %45, %47, %38 : tensor<1024xi1>, tensor<1024xi32>
    %49 = stablehlo.broadcast_in_dim %43, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %50 = stablehlo.broadcast_in_dim %48, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %51 = stablehlo.concatenate %49, %50, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %52 = "stablehlo.gather"(%25, %51) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<512x16xf32>, tensor<1024x2xi32>) -> tensor<1024xf32>
    %53 = stablehlo.reshape %52 : (tensor<1024xf32>) -> tensor<512x2xf32>
    %c_15 = stablehlo.constant dense<false> : tensor<i1>
    %54 = stablehlo.broadcast_in_dim %c_15, dims = [] : (tensor<i1>) -> tensor<0xi1>
    %c_16 = stablehlo.constant dense<0> : tensor<i32>
    %55 = "stablehlo.case"(%c_16) ({
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %56:4 = "stablehlo.case"(%55) ({
      %92:5 = stablehlo.custom_call @jax_moe_ffi_dispatch_plan(%indices, %54) {backend_config = "", mhlo.backend_config = {align = 1 : i64, capacity = -1 : i64, chunk = 256 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>]} : (tensor<512x2xi32>, tensor<0xi1>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<81xi32>)
      stablehlo.return %92#0, %92#1, %92#2, %92#3 : tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>
    }) : (tensor<i32>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>)
    %cst_17 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %57 = stablehlo.broadcast_in_dim %cst_17, dims = [] : (tensor<f32>) -> tensor<0xf32>
    %c_18 = stablehlo.constant dense<0> : tensor<i32>
    %58 = "stablehlo.case"(%c_18) ({
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %59 = "stablehlo.case"(%58) ({
      %92 = stablehlo.custom_call @jax_moe_ffi_dispatch(%arg4, %56#0, %56#1, %57) {backend_config = "", mhlo.backend_config = {top_k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x256xf32>, tensor<512x2xi32>, tensor<1024xi32>, tensor<0xf32>) -> tensor<1024x256xf32>
      stablehlo.return %92 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %c_19 = stablehlo.constant dense<0> : tensor<i32>
    %60 = stablehlo.broadcast_in_dim %c_19, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %61 = stablehlo.compare GE, %56#1, %60, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %62 = stablehlo.reshape %53 : (tensor<512x2xf32>) -> tensor<1024xf32>
    %c_20 = stablehlo.constant dense<0> : tensor<i32>
    %63 = stablehlo.broadcast_in_dim %c_20, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %64 = stablehlo.maximum %56#1, %63 : tensor<1024xi32>
    %c_21 = stablehlo.constant dense<0> : tensor<i32>
    %65 = stablehlo.broadcast_in_dim %c_21, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %66 = stablehlo.compare LT, %64, %65, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_22 = stablehlo.constant dense<1024> : tensor<i32>
    %67 = stablehlo.broadcast_in_dim %c_22, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %68 = stablehlo.add %64, %67 : tensor<1024xi32>
    %69 = stablehlo.select %66, %68, %64 : tensor<1024xi1>, tensor<1024xi32>
    %70 = stablehlo.broadcast_in_dim %69, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %71 = "stablehlo.gather"(%62, %70) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xf32>, tensor<1024x1xi32>) -> tensor<1024xf32>
    %cst_23 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %72 = call @_where_1(%61, %71, %cst_23) : (tensor<1024xi1>, tensor<1024xf32>, tensor<f32>) -> tensor<1024xf32>
    %c_24 = stablehlo.constant dense<0> : tensor<i32>
    %73 = "stablehlo.case"(%c_24) ({
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }, {
      %c_29 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_29 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %74 = "stablehlo.case"(%73) ({
      %92 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%59, %arg2, %56#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      stablehlo.return %92 : tensor<1024x512xf32>
    }) : (tensor<i32>) -> tensor<1024x512xf32>
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
    %76 = "stablehlo.case"(%75) ({
      %92 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%59, %arg3, %56#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      stablehlo.return %92 : tensor<1024x512xf32>
    }) : (tensor<i32>) -> tensor<1024x512xf32>
    %77 = stablehlo.negate %74 : tensor<1024x512xf32>
    %78 = stablehlo.exponential %77 : tensor<1024x512xf32>
    %cst_26 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %79 = stablehlo.broadcast_in_dim %cst_26, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %80 = stablehlo.add %79, %78 : tensor<1024x512xf32>
    %cst_27 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %81 = stablehlo.broadcast_in_dim %cst_27, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %82 = stablehlo.divide %81, %80 : tensor<1024x512xf32>
    %83 = stablehlo.multiply %74, %82 : tensor<1024x512xf32>
    %84 = stablehlo.multiply %83, %76 : tensor<1024x512xf32>
    %85 = stablehlo.broadcast_in_dim %72, dims = [0] : (tensor<1024xf32>) -> tensor<1024x1xf32>
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
      %92 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%87, %arg1, %56#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x512xf32>, tensor<16x512x256xf32>, tensor<16xi32>) -> tensor<1024x256xf32>
      stablehlo.return %92 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %90 = call @compute_on(%56#0, %56#1, %56#2, %56#3, %89) {mhlo.frontend_attributes = {_xla_stream_annotation = "2", inlineable = "false"}} : (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<1024x256xf32>) -> tensor<512x256xf32>
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
