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
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %13:2 = "stablehlo.case"(%12) ({
      %143:2 = stablehlo.custom_call @jax_moe_ffi_top_k(%11) {backend_config = "", mhlo.backend_config = {k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x16xf32>) -> (tensor<512x2xf32>, tensor<512x2xi32>)
      stablehlo.return %143#0, %143#1 : tensor<512x2xf32>, tensor<512x2xi32>
    }) : (tensor<i32>) -> (tensor<512x2xf32>, tensor<512x2xi32>)
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %14 = stablehlo.reduce(%13#0 init: %cst_2) applies stablehlo.add across dimensions = [1] : (tensor<512x2xf32>, tensor<f32>) -> tensor<512xf32>
    %15 = stablehlo.broadcast_in_dim %14, dims = [0] : (tensor<512xf32>) -> tensor<512x1xf32>
    %16 = stablehlo.broadcast_in_dim %15, dims = [0, 1] : (tensor<512x1xf32>) -> tensor<512x2xf32>
    %17 = stablehlo.divide %13#0, %16 : tensor<512x2xf32>
    %18 = stablehlo.reshape %13#1 : (tensor<512x2xi32>) -> tensor<1024xi32>
    %19 = stablehlo.iota dim = 0 : tensor<1024xi32>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %20 = stablehlo.broadcast_in_dim %c_3, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %21 = stablehlo.compare LT, %19, %20, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_4 = stablehlo.constant dense<1024> : tensor<i32>
    %22 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %23 = stablehlo.add %19, %22 : tensor<1024xi32>
    %24 = stablehlo.select %21, %23, %19 : tensor<1024xi1>, tensor<1024xi32>
    %25 = stablehlo.broadcast_in_dim %24, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %26 = "stablehlo.gather"(%18, %25) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xi32>, tensor<1024x1xi32>) -> tensor<1024xi32>
    %c_5 = stablehlo.constant dense<2> : tensor<i32>
    %27 = call @floor_divide(%19, %c_5) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_6 = stablehlo.constant dense<512> : tensor<i32>
    %28 = call @remainder(%27, %c_6) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_7 = stablehlo.constant dense<2> : tensor<i32>
    %29 = call @remainder(%19, %c_7) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_8 = stablehlo.constant dense<false> : tensor<i1>
    %30 = stablehlo.broadcast_in_dim %c_8, dims = [] : (tensor<i1>) -> tensor<0xi1>
    %c_9 = stablehlo.constant dense<0> : tensor<i32>
    %31 = "stablehlo.case"(%c_9) ({
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %32:4 = "stablehlo.case"(%31) ({
      %143:5 = stablehlo.custom_call @jax_moe_ffi_dispatch_plan(%13#1, %30) {backend_config = "", mhlo.backend_config = {align = 1 : i64, capacity = 64 : i64, chunk = 256 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>]} : (tensor<512x2xi32>, tensor<0xi1>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<81xi32>)
      stablehlo.return %143#0, %143#1, %143#2, %143#3 : tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>
    }) : (tensor<i32>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>)
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %33 = stablehlo.broadcast_in_dim %c_10, dims = [] : (tensor<i32>) -> tensor<512x2xi32>
    %34 = stablehlo.compare GE, %32#0, %33, SIGNED : (tensor<512x2xi32>, tensor<512x2xi32>) -> tensor<512x2xi1>
    %35 = stablehlo.reshape %13#1 : (tensor<512x2xi32>) -> tensor<1024xi32>
    %36 = call @cumsum(%32#3) : (tensor<16xi32>) -> tensor<16xi32>
    %37 = stablehlo.subtract %36, %32#3 : tensor<16xi32>
    %38 = stablehlo.reshape %32#0 : (tensor<512x2xi32>) -> tensor<1024xi32>
    %c_11 = stablehlo.constant dense<0> : tensor<i32>
    %c_12 = stablehlo.constant dense<15> : tensor<i32>
    %39 = call @clip(%35, %c_11, %c_12) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %40 = stablehlo.broadcast_in_dim %c_13, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %41 = stablehlo.compare LT, %39, %40, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_14 = stablehlo.constant dense<16> : tensor<i32>
    %42 = stablehlo.broadcast_in_dim %c_14, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %43 = stablehlo.add %39, %42 : tensor<1024xi32>
    %44 = stablehlo.select %41, %43, %39 : tensor<1024xi1>, tensor<1024xi32>
    %45 = stablehlo.broadcast_in_dim %44, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %46 = "stablehlo.gather"(%37, %45) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<16xi32>, tensor<1024x1xi32>) -> tensor<1024xi32>
    %47 = stablehlo.subtract %38, %46 : tensor<1024xi32>
    %48 = stablehlo.reshape %47 : (tensor<1024xi32>) -> tensor<512x2xi32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %49 = call @_where_2(%34, %48, %c_15) : (tensor<512x2xi1>, tensor<512x2xi32>, tensor<i32>) -> tensor<512x2xi32>
    %c_16 = stablehlo.constant dense<0> : tensor<i32>
    %50 = stablehlo.broadcast_in_dim %c_16, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %51 = stablehlo.compare LT, %28, %50, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_17 = stablehlo.constant dense<512> : tensor<i32>
    %52 = stablehlo.broadcast_in_dim %c_17, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %53 = stablehlo.add %28, %52 : tensor<1024xi32>
    %54 = stablehlo.select %51, %53, %28 : tensor<1024xi1>, tensor<1024xi32>
    %c_18 = stablehlo.constant dense<0> : tensor<i32>
    %55 = stablehlo.broadcast_in_dim %c_18, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %56 = stablehlo.compare LT, %29, %55, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_19 = stablehlo.constant dense<2> : tensor<i32>
    %57 = stablehlo.broadcast_in_dim %c_19, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %58 = stablehlo.add %29, %57 : tensor<1024xi32>
    %59 = stablehlo.select %56, %58, %29 : tensor<1024xi1>, tensor<1024xi32>
    %60 = stablehlo.broadcast_in_dim %54, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %61 = stablehlo.broadcast_in_dim %59, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %62 = stablehlo.concatenate %60, %61, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %63 = "stablehlo.gather"(%49, %62) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<512x2xi32>, tensor<1024x2xi32>) -> tensor<1024xi32>
    %c_20 = stablehlo.constant dense<0> : tensor<i32>
    %64 = stablehlo.broadcast_in_dim %c_20, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %65 = stablehlo.subtract %63, %64 : tensor<1024xi32>
    %66 = stablehlo.broadcast_in_dim %13#1, dims = [0, 1] : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %67 = stablehlo.iota dim = 0 : tensor<16xi32>
    %68 = stablehlo.broadcast_in_dim %67, dims = [2] : (tensor<16xi32>) -> tensor<1x1x16xi32>
    %69 = stablehlo.broadcast_in_dim %66, dims = [0, 1, 2] : (tensor<512x2x1xi32>) -> tensor<512x2x16xi32>
    %70 = stablehlo.broadcast_in_dim %68, dims = [0, 1, 2] : (tensor<1x1x16xi32>) -> tensor<512x2x16xi32>
    %71 = stablehlo.compare EQ, %69, %70, SIGNED : (tensor<512x2x16xi32>, tensor<512x2x16xi32>) -> tensor<512x2x16xi1>
    %72 = stablehlo.broadcast_in_dim %34, dims = [0, 1] : (tensor<512x2xi1>) -> tensor<512x2x1xi1>
    %73 = stablehlo.broadcast_in_dim %72, dims = [0, 1, 2] : (tensor<512x2x1xi1>) -> tensor<512x2x16xi1>
    %74 = stablehlo.and %71, %73 : tensor<512x2x16xi1>
    %75 = stablehlo.convert %74 : (tensor<512x2x16xi1>) -> tensor<512x2x16xf32>
    %76 = stablehlo.transpose %75, dims = [0, 2, 1] : (tensor<512x2x16xf32>) -> tensor<512x16x2xf32>
    %c_21 = stablehlo.constant dense<0> : tensor<i32>
    %c_22 = stablehlo.constant dense<511> : tensor<i32>
    %77 = call @clip(%28, %c_21, %c_22) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_23 = stablehlo.constant dense<0> : tensor<i32>
    %c_24 = stablehlo.constant dense<15> : tensor<i32>
    %78 = call @clip(%26, %c_23, %c_24) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_25 = stablehlo.constant dense<0> : tensor<i32>
    %79 = stablehlo.broadcast_in_dim %c_25, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %80 = stablehlo.compare LT, %77, %79, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_26 = stablehlo.constant dense<512> : tensor<i32>
    %81 = stablehlo.broadcast_in_dim %c_26, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %82 = stablehlo.add %77, %81 : tensor<1024xi32>
    %83 = stablehlo.select %80, %82, %77 : tensor<1024xi1>, tensor<1024xi32>
    %c_27 = stablehlo.constant dense<0> : tensor<i32>
    %84 = stablehlo.broadcast_in_dim %c_27, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %85 = stablehlo.compare LT, %78, %84, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_28 = stablehlo.constant dense<16> : tensor<i32>
    %86 = stablehlo.broadcast_in_dim %c_28, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %87 = stablehlo.add %78, %86 : tensor<1024xi32>
    %88 = stablehlo.select %85, %87, %78 : tensor<1024xi1>, tensor<1024xi32>
    %89 = stablehlo.broadcast_in_dim %83, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %90 = stablehlo.broadcast_in_dim %88, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %91 = stablehlo.concatenate %89, %90, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %92 = "stablehlo.gather"(%76, %91) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1, 2>}> : (tensor<512x16x2xf32>, tensor<1024x2xi32>) -> tensor<1024x2xf32>
    %c_29 = stablehlo.constant dense<0> : tensor<i32>
    %93 = call @_where_2(%34, %48, %c_29) : (tensor<512x2xi1>, tensor<512x2xi32>, tensor<i32>) -> tensor<512x2xi32>
    %94 = stablehlo.reshape %93 : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %95 = stablehlo.transpose %94, dims = [0, 2, 1] : (tensor<512x2x1xi32>) -> tensor<512x1x2xi32>
    %96 = stablehlo.reshape %95 : (tensor<512x1x2xi32>) -> tensor<512x2xi32>
    %97 = stablehlo.broadcast_in_dim %96, dims = [0, 2] : (tensor<512x2xi32>) -> tensor<512x1x2xi32>
    %98 = stablehlo.broadcast_in_dim %97, dims = [0, 1, 2] : (tensor<512x1x2xi32>) -> tensor<512x2x2xi32>
    %99 = stablehlo.reshape %98 : (tensor<512x2x2xi32>) -> tensor<1024x2xi32>
    %100 = stablehlo.reshape %65 : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %101 = stablehlo.broadcast_in_dim %100, dims = [0, 1] : (tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %102 = stablehlo.compare EQ, %99, %101, SIGNED : (tensor<1024x2xi32>, tensor<1024x2xi32>) -> tensor<1024x2xi1>
    %103 = stablehlo.convert %102 : (tensor<1024x2xi1>) -> tensor<1024x2xf32>
    %104 = stablehlo.broadcast_in_dim %17, dims = [0, 2] : (tensor<512x2xf32>) -> tensor<512x1x2xf32>
    %105 = stablehlo.broadcast_in_dim %104, dims = [0, 1, 2] : (tensor<512x1x2xf32>) -> tensor<512x2x2xf32>
    %106 = stablehlo.reshape %105 : (tensor<512x2x2xf32>) -> tensor<1024x2xf32>
    %107 = stablehlo.dot_general %103, %106, batching_dims = [0, 1] x [0, 1], contracting_dims = [] x [], precision = [DEFAULT, DEFAULT] : (tensor<1024x2xf32>, tensor<1024x2xf32>) -> tensor<1024x2xf32>
    %108 = stablehlo.dot_general %92, %107, batching_dims = [0] x [0], contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1024x2xf32>, tensor<1024x2xf32>) -> tensor<1024xf32>
    %109 = stablehlo.reshape %108 : (tensor<1024xf32>) -> tensor<512x2xf32>
    %cst_30 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %110 = stablehlo.broadcast_in_dim %cst_30, dims = [] : (tensor<f32>) -> tensor<0xf32>
    %c_31 = stablehlo.constant dense<0> : tensor<i32>
    %111 = "stablehlo.case"(%c_31) ({
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %112 = "stablehlo.case"(%111) ({
      %143 = stablehlo.custom_call @jax_moe_ffi_dispatch(%arg4, %32#0, %32#1, %110) {backend_config = "", mhlo.backend_config = {top_k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x256xf32>, tensor<512x2xi32>, tensor<1024xi32>, tensor<0xf32>) -> tensor<1024x256xf32>
      stablehlo.return %143 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %c_32 = stablehlo.constant dense<0> : tensor<i32>
    %113 = stablehlo.broadcast_in_dim %c_32, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %114 = stablehlo.compare GE, %32#1, %113, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %115 = stablehlo.reshape %109 : (tensor<512x2xf32>) -> tensor<1024xf32>
    %c_33 = stablehlo.constant dense<0> : tensor<i32>
    %116 = stablehlo.broadcast_in_dim %c_33, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %117 = stablehlo.maximum %32#1, %116 : tensor<1024xi32>
    %c_34 = stablehlo.constant dense<0> : tensor<i32>
    %118 = stablehlo.broadcast_in_dim %c_34, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %119 = stablehlo.compare LT, %117, %118, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_35 = stablehlo.constant dense<1024> : tensor<i32>
    %120 = stablehlo.broadcast_in_dim %c_35, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %121 = stablehlo.add %117, %120 : tensor<1024xi32>
    %122 = stablehlo.select %119, %121, %117 : tensor<1024xi1>, tensor<1024xi32>
    %123 = stablehlo.broadcast_in_dim %122, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %124 = "stablehlo.gather"(%115, %123) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xf32>, tensor<1024x1xi32>) -> tensor<1024xf32>
    %cst_36 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %125 = call @_where_3(%114, %124, %cst_36) : (tensor<1024xi1>, tensor<1024xf32>, tensor<f32>) -> tensor<1024xf32>
    %c_37 = stablehlo.constant dense<0> : tensor<i32>
    %126 = "stablehlo.case"(%c_37) ({
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %127:2 = "stablehlo.case"(%126) ({
      %143 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%112, %arg2, %32#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      %144 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%112, %arg3, %32#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      stablehlo.return %143, %144 : tensor<1024x512xf32>, tensor<1024x512xf32>
    }) : (tensor<i32>) -> (tensor<1024x512xf32>, tensor<1024x512xf32>)
    %128 = stablehlo.negate %127#0 : tensor<1024x512xf32>
    %129 = stablehlo.exponential %128 : tensor<1024x512xf32>
    %cst_38 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %130 = stablehlo.broadcast_in_dim %cst_38, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %131 = stablehlo.add %130, %129 : tensor<1024x512xf32>
    %cst_39 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %132 = stablehlo.broadcast_in_dim %cst_39, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %133 = stablehlo.divide %132, %131 : tensor<1024x512xf32>
    %134 = stablehlo.multiply %127#0, %133 : tensor<1024x512xf32>
    %135 = stablehlo.multiply %134, %127#1 : tensor<1024x512xf32>
    %136 = stablehlo.broadcast_in_dim %125, dims = [0] : (tensor<1024xf32>) -> tensor<1024x1xf32>
    %137 = stablehlo.broadcast_in_dim %136, dims = [0, 1] : (tensor<1024x1xf32>) -> tensor<1024x512xf32>
    %138 = stablehlo.multiply %135, %137 : tensor<1024x512xf32>
    %c_40 = stablehlo.constant dense<0> : tensor<i32>
    %139 = "stablehlo.case"(%c_40) ({
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }, {
      %c_41 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_41 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %140 = "stablehlo.case"(%139) ({
      %143 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%138, %arg1, %32#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x512xf32>, tensor<16x512x256xf32>, tensor<16xi32>) -> tensor<1024x256xf32>
      stablehlo.return %143 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %141 = call @compute_on(%32#0, %32#1, %32#2, %32#3, %140) {mhlo.frontend_attributes = {_xla_stream_annotation = "2", inlineable = "false"}} : (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<1024x256xf32>) -> tensor<512x256xf32>
    %142 = stablehlo.custom_call @annotate_device_placement(%141) {backend_config = "", has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<512x256xf32>) -> tensor<512x256xf32>
    return %142 : tensor<512x256xf32>
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
  func.func private @cumsum(%arg0: tensor<16xi32>) -> tensor<16xi32> {
    %0 = call @cumsum_1(%arg0) : (tensor<16xi32>) -> tensor<16xi32>
    return %0 : tensor<16xi32>
  }
  func.func private @cumsum_1(%arg0: tensor<16xi32>) -> tensor<16xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<i32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1>, padding = dense<[[15, 0]]> : tensor<1x2xi64>, window_dilations = array<i64: 1>, window_dimensions = array<i64: 16>, window_strides = array<i64: 1>}> ({
    ^bb0(%arg1: tensor<i32>, %arg2: tensor<i32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<i32>
      stablehlo.return %2 : tensor<i32>
    }) : (tensor<16xi32>, tensor<i32>) -> tensor<16xi32>
    return %1 : tensor<16xi32>
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
  func.func private @_where_2(%arg0: tensor<512x2xi1>, %arg1: tensor<512x2xi32>, %arg2: tensor<i32>) -> tensor<512x2xi32> {
    %0 = stablehlo.convert %arg2 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<512x2xi32>
    %2 = stablehlo.select %arg0, %arg1, %1 : tensor<512x2xi1>, tensor<512x2xi32>
    return %2 : tensor<512x2xi32>
  }
  func.func private @_where_3(%arg0: tensor<1024xi1>, %arg1: tensor<1024xf32>, %arg2: tensor<f32>) -> tensor<1024xf32> {
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
