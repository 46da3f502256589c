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
    %16 = stablehlo.reshape %indices : (tensor<512x2xi32>) -> tensor<1024xi32>
    %17 = stablehlo.iota dim = 0 : tensor<1024xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %18 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %19 = stablehlo.compare LT, %17, %18, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_3 = stablehlo.constant dense<1024> : tensor<i32>
    %20 = stablehlo.broadcast_in_dim %c_3, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %21 = stablehlo.add %17, %20 : tensor<1024xi32>
    %22 = stablehlo.select %19, %21, %17 : tensor<1024xi1>, tensor<1024xi32>
    %23 = stablehlo.broadcast_in_dim %22, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %24 = "stablehlo.gather"(%16, %23) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xi32>, tensor<1024x1xi32>) -> tensor<1024xi32>
    %c_4 = stablehlo.constant dense<2> : tensor<i32>
    %25 = call @floor_divide(%17, %c_4) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_5 = stablehlo.constant dense<512> : tensor<i32>
    %26 = call @remainder(%25, %c_5) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_6 = stablehlo.constant dense<2> : tensor<i32>
    %27 = call @remainder(%17, %c_6) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_7 = stablehlo.constant dense<false> : tensor<i1>
    %28 = stablehlo.broadcast_in_dim %c_7, dims = [] : (tensor<i1>) -> tensor<0xi1>
    %c_8 = stablehlo.constant dense<0> : tensor<i32>
    %29 = "stablehlo.case"(%c_8) ({
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %30:4 = "stablehlo.case"(%29) ({
      %153:5 = stablehlo.custom_call @jax_moe_ffi_dispatch_plan(%indices, %28) {backend_config = "", mhlo.backend_config = {align = 1 : i64, capacity = 64 : i64, chunk = 256 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>]} : (tensor<512x2xi32>, tensor<0xi1>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<81xi32>)
      stablehlo.return %153#0, %153#1, %153#2, %153#3 : tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>
    }) : (tensor<i32>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>)
    %c_9 = stablehlo.constant dense<0> : tensor<i32>
    %31 = stablehlo.broadcast_in_dim %c_9, dims = [] : (tensor<i32>) -> tensor<512x2xi32>
    %32 = stablehlo.compare GE, %30#0, %31, SIGNED : (tensor<512x2xi32>, tensor<512x2xi32>) -> tensor<512x2xi1>
    %33 = stablehlo.reshape %indices : (tensor<512x2xi32>) -> tensor<1024xi32>
    %34 = call @cumsum(%30#3) : (tensor<16xi32>) -> tensor<16xi32>
    %35 = stablehlo.subtract %34, %30#3 : tensor<16xi32>
    %36 = stablehlo.reshape %30#0 : (tensor<512x2xi32>) -> tensor<1024xi32>
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %c_11 = stablehlo.constant dense<15> : tensor<i32>
    %37 = call @clip(%33, %c_10, %c_11) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_12 = stablehlo.constant dense<0> : tensor<i32>
    %38 = stablehlo.broadcast_in_dim %c_12, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %39 = stablehlo.compare LT, %37, %38, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_13 = stablehlo.constant dense<16> : tensor<i32>
    %40 = stablehlo.broadcast_in_dim %c_13, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %41 = stablehlo.add %37, %40 : tensor<1024xi32>
    %42 = stablehlo.select %39, %41, %37 : tensor<1024xi1>, tensor<1024xi32>
    %43 = stablehlo.broadcast_in_dim %42, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %44 = "stablehlo.gather"(%35, %43) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<16xi32>, tensor<1024x1xi32>) -> tensor<1024xi32>
    %45 = stablehlo.subtract %36, %44 : tensor<1024xi32>
    %46 = stablehlo.reshape %45 : (tensor<1024xi32>) -> tensor<512x2xi32>
    %c_14 = stablehlo.constant dense<0> : tensor<i32>
    %47 = call @_where_2(%32, %46, %c_14) : (tensor<512x2xi1>, tensor<512x2xi32>, tensor<i32>) -> tensor<512x2xi32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %48 = stablehlo.broadcast_in_dim %c_15, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %49 = stablehlo.compare LT, %26, %48, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_16 = stablehlo.constant dense<512> : tensor<i32>
    %50 = stablehlo.broadcast_in_dim %c_16, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %51 = stablehlo.add %26, %50 : tensor<1024xi32>
    %52 = stablehlo.select %49, %51, %26 : tensor<1024xi1>, tensor<1024xi32>
    %c_17 = stablehlo.constant dense<0> : tensor<i32>
    %53 = stablehlo.broadcast_in_dim %c_17, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %54 = stablehlo.compare LT, %27, %53, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_18 = stablehlo.constant dense<2> : tensor<i32>
    %55 = stablehlo.broadcast_in_dim %c_18, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %56 = stablehlo.add %27, %55 : tensor<1024xi32>
    %57 = stablehlo.select %54, %56, %27 : tensor<1024xi1>, tensor<1024xi32>
    %58 = stablehlo.broadcast_in_dim %52, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %59 = stablehlo.broadcast_in_dim %57, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %60 = stablehlo.concatenate %58, %59, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %61 = "stablehlo.gather"(%47, %60) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<512x2xi32>, tensor<1024x2xi32>) -> tensor<1024xi32>
    %c_19 = stablehlo.constant dense<0> : tensor<i32>
    %62 = stablehlo.broadcast_in_dim %c_19, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %63 = stablehlo.subtract %61, %62 : tensor<1024xi32>
    %64 = stablehlo.broadcast_in_dim %indices, dims = [0, 1] : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %65 = stablehlo.iota dim = 0 : tensor<16xi32>
    %66 = stablehlo.broadcast_in_dim %65, dims = [2] : (tensor<16xi32>) -> tensor<1x1x16xi32>
    %67 = stablehlo.broadcast_in_dim %64, dims = [0, 1, 2] : (tensor<512x2x1xi32>) -> tensor<512x2x16xi32>
    %68 = stablehlo.broadcast_in_dim %66, dims = [0, 1, 2] : (tensor<1x1x16xi32>) -> tensor<512x2x16xi32>
    %69 = stablehlo.compare EQ, %67, %68, SIGNED : (tensor<512x2x16xi32>, tensor<512x2x16xi32>) -> tensor<512x2x16xi1>
    %70 = stablehlo.broadcast_in_dim %32, dims = [0, 1] : (tensor<512x2xi1>) -> tensor<512x2x1xi1>
    %71 = stablehlo.broadcast_in_dim %70, dims = [0, 1, 2] : (tensor<512x2x1xi1>) -> tensor<512x2x16xi1>
    %72 = stablehlo.and %69, %71 : tensor<512x2x16xi1>
    %73 = stablehlo.convert %72 : (tensor<512x2x16xi1>) -> tensor<512x2x16xf32>
    %74 = stablehlo.transpose %73, dims = [0, 2, 1] : (tensor<512x2x16xf32>) -> tensor<512x16x2xf32>
    %c_20 = stablehlo.constant dense<0> : tensor<i32>
    %c_21 = stablehlo.constant dense<511> : tensor<i32>
    %75 = call @clip(%26, %c_20, %c_21) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_22 = stablehlo.constant dense<0> : tensor<i32>
    %c_23 = stablehlo.constant dense<15> : tensor<i32>
    %76 = call @clip(%24, %c_22, %c_23) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_24 = stablehlo.constant dense<0> : tensor<i32>
    %77 = stablehlo.broadcast_in_dim %c_24, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %78 = stablehlo.compare LT, %75, %77, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_25 = stablehlo.constant dense<512> : tensor<i32>
    %79 = stablehlo.broadcast_in_dim %c_25, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %80 = stablehlo.add %75, %79 : tensor<1024xi32>
    %81 = stablehlo.select %78, %80, %75 : tensor<1024xi1>, tensor<1024xi32>
    %c_26 = stablehlo.constant dense<0> : tensor<i32>
    %82 = stablehlo.broadcast_in_dim %c_26, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %83 = stablehlo.compare LT, %76, %82, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_27 = stablehlo.constant dense<16> : tensor<i32>
    %84 = stablehlo.broadcast_in_dim %c_27, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %85 = stablehlo.add %76, %84 : tensor<1024xi32>
    %86 = stablehlo.select %83, %85, %76 : tensor<1024xi1>, tensor<1024xi32>
    %87 = stablehlo.broadcast_in_dim %81, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %88 = stablehlo.broadcast_in_dim %86, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %89 = stablehlo.concatenate %87, %88, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %90 = "stablehlo.gather"(%74, %89) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1, 2>}> : (tensor<512x16x2xf32>, tensor<1024x2xi32>) -> tensor<1024x2xf32>
    %c_28 = stablehlo.constant dense<0> : tensor<i32>
    %91 = call @_where_2(%32, %46, %c_28) : (tensor<512x2xi1>, tensor<512x2xi32>, tensor<i32>) -> tensor<512x2xi32>
    %92 = stablehlo.reshape %91 : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %93 = stablehlo.transpose %92, dims = [0, 2, 1] : (tensor<512x2x1xi32>) -> tensor<512x1x2xi32>
    %94 = stablehlo.reshape %93 : (tensor<512x1x2xi32>) -> tensor<512x2xi32>
    %c_29 = stablehlo.constant dense<0> : tensor<i32>
    %c_30 = stablehlo.constant dense<511> : tensor<i32>
    %95 = call @clip(%26, %c_29, %c_30) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_31 = stablehlo.constant dense<0> : tensor<i32>
    %96 = stablehlo.broadcast_in_dim %c_31, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %97 = stablehlo.compare LT, %95, %96, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_32 = stablehlo.constant dense<512> : tensor<i32>
    %98 = stablehlo.broadcast_in_dim %c_32, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %99 = stablehlo.add %95, %98 : tensor<1024xi32>
    %100 = stablehlo.select %97, %99, %95 : tensor<1024xi1>, tensor<1024xi32>
    %101 = stablehlo.broadcast_in_dim %100, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %102 = "stablehlo.gather"(%94, %101) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2>}> : (tensor<512x2xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %103 = stablehlo.reshape %63 : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %104 = stablehlo.broadcast_in_dim %103, dims = [0, 1] : (tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %105 = stablehlo.compare EQ, %102, %104, SIGNED : (tensor<1024x2xi32>, tensor<1024x2xi32>) -> tensor<1024x2xi1>
    %106 = stablehlo.convert %105 : (tensor<1024x2xi1>) -> tensor<1024x2xf32>
    %c_33 = stablehlo.constant dense<0> : tensor<i32>
    %c_34 = stablehlo.constant dense<511> : tensor<i32>
    %107 = call @clip(%26, %c_33, %c_34) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_35 = stablehlo.constant dense<0> : tensor<i32>
    %108 = stablehlo.broadcast_in_dim %c_35, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %109 = stablehlo.compare LT, %107, %108, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_36 = stablehlo.constant dense<512> : tensor<i32>
    %110 = stablehlo.broadcast_in_dim %c_36, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %111 = stablehlo.add %107, %110 : tensor<1024xi32>
    %112 = stablehlo.select %109, %111, %107 : tensor<1024xi1>, tensor<1024xi32>
    %113 = stablehlo.broadcast_in_dim %112, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %114 = "stablehlo.gather"(%15, %113) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2>}> : (tensor<512x2xf32>, tensor<1024x1xi32>) -> tensor<1024x2xf32>
    %115 = stablehlo.dot_general %106, %114, batching_dims = [0, 1] x [0, 1], contracting_dims = [] x [], precision = [DEFAULT, DEFAULT] : (tensor<1024x2xf32>, tensor<1024x2xf32>) -> tensor<1024x2xf32>
    %116 = stablehlo.dot_general %90, %115, batching_dims = [0] x [0], contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1024x2xf32>, tensor<1024x2xf32>) -> tensor<1024xf32>
    %117 = stablehlo.reshape %116 : (tensor<1024xf32>) -> tensor<512x2xf32>
    %cst_37 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %118 = stablehlo.broadcast_in_dim %cst_37, dims = [] : (tensor<f32>) -> tensor<0xf32>
    %c_38 = stablehlo.constant dense<0> : tensor<i32>
    %119 = "stablehlo.case"(%c_38) ({
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %120 = "stablehlo.case"(%119) ({
      %153 = stablehlo.custom_call @jax_moe_ffi_dispatch(%arg4, %30#0, %30#1, %118) {backend_config = "", mhlo.backend_config = {top_k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x256xf32>, tensor<512x2xi32>, tensor<1024xi32>, tensor<0xf32>) -> tensor<1024x256xf32>
      stablehlo.return %153 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %c_39 = stablehlo.constant dense<0> : tensor<i32>
    %121 = stablehlo.broadcast_in_dim %c_39, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %122 = stablehlo.compare GE, %30#1, %121, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %123 = stablehlo.reshape %117 : (tensor<512x2xf32>) -> tensor<1024xf32>
    %c_40 = stablehlo.constant dense<0> : tensor<i32>
    %124 = stablehlo.broadcast_in_dim %c_40, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %125 = stablehlo.maximum %30#1, %124 : tensor<1024xi32>
    %c_41 = stablehlo.constant dense<0> : tensor<i32>
    %126 = stablehlo.broadcast_in_dim %c_41, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %127 = stablehlo.compare LT, %125, %126, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_42 = stablehlo.constant dense<1024> : tensor<i32>
    %128 = stablehlo.broadcast_in_dim %c_42, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %129 = stablehlo.add %125, %128 : tensor<1024xi32>
    %130 = stablehlo.select %127, %129, %125 : tensor<1024xi1>, tensor<1024xi32>
    %131 = stablehlo.broadcast_in_dim %130, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %132 = "stablehlo.gather"(%123, %131) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xf32>, tensor<1024x1xi32>) -> tensor<1024xf32>
    %cst_43 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %133 = call @_where_3(%122, %132, %cst_43) : (tensor<1024xi1>, tensor<1024xf32>, tensor<f32>) -> tensor<1024xf32>
    %c_44 = stablehlo.constant dense<0> : tensor<i32>
    %134 = "stablehlo.case"(%c_44) ({
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %135 = "stablehlo.case"(%134) ({
      %153 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%120, %arg2, %30#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      stablehlo.return %153 : tensor<1024x512xf32>
    }) : (tensor<i32>) -> tensor<1024x512xf32>
    %c_45 = stablehlo.constant dense<0> : tensor<i32>
    %136 = "stablehlo.case"(%c_45) ({
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %137 = "stablehlo.case"(%136) ({
      %153 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%120, %arg3, %30#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      stablehlo.return %153 : tensor<1024x512xf32>
    }) : (tensor<i32>) -> tensor<1024x512xf32>
    %138 = stablehlo.negate %135 : tensor<1024x512xf32>
    %139 = stablehlo.exponential %138 : tensor<1024x512xf32>
    %cst_46 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %140 = stablehlo.broadcast_in_dim %cst_46, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %141 = stablehlo.add %140, %139 : tensor<1024x512xf32>
    %cst_47 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %142 = stablehlo.broadcast_in_dim %cst_47, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %143 = stablehlo.divide %142, %141 : tensor<1024x512xf32>
    %144 = stablehlo.multiply %135, %143 : tensor<1024x512xf32>
    %145 = stablehlo.multiply %144, %137 : tensor<1024x512xf32>
    %146 = stablehlo.broadcast_in_dim %133, dims = [0] : (tensor<1024xf32>) -> tensor<1024x1xf32>
    %147 = stablehlo.broadcast_in_dim %146, dims = [0, 1] : (tensor<1024x1xf32>) -> tensor<1024x512xf32>
    %148 = stablehlo.multiply %145, %147 : tensor<1024x512xf32>
    %c_48 = stablehlo.constant dense<0> : tensor<i32>
    %149 = "stablehlo.case"(%c_48) ({
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }, {
      %c_49 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_49 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %150 = "stablehlo.case"(%149) ({
      %153 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%148, %arg1, %30#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x512xf32>, tensor<16x512x256xf32>, tensor<16xi32>) -> tensor<1024x256xf32>
      stablehlo.return %153 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %151 = call @compute_on(%30#0, %30#1, %30#2, %30#3, %150) {mhlo.frontend_attributes = {_xla_stream_annotation = "2", inlineable = "false"}} : (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<1024x256xf32>) -> tensor<512x256xf32>
    %152 = stablehlo.custom_call @annotate_device_placement(%151) {backend_config = "", has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<512x256xf32>) -> tensor<512x256xf32>
    return %152 : tensor<512x256xf32>
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
