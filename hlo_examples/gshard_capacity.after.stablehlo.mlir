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
    %21 = stablehlo.convert %20 : (tensor<512x2x16xi1>) -> tensor<512x2x16xi32>
    %22 = stablehlo.reshape %21 : (tensor<512x2x16xi32>) -> tensor<1024x16xi32>
    %23 = call @cumsum(%22) : (tensor<1024x16xi32>) -> tensor<1024x16xi32>
    %c = stablehlo.constant dense<1> : tensor<i32>
    %24 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<1024x16xi32>
    %25 = stablehlo.subtract %23, %24 : tensor<1024x16xi32>
    %26 = stablehlo.reshape %25 : (tensor<1024x16xi32>) -> tensor<512x2x16xi32>
    %c_3 = stablehlo.constant dense<64> : tensor<i32>
    %27 = stablehlo.broadcast_in_dim %c_3, dims = [] : (tensor<i32>) -> tensor<512x2x16xi32>
    %28 = stablehlo.compare LT, %26, %27, SIGNED : (tensor<512x2x16xi32>, tensor<512x2x16xi32>) -> tensor<512x2x16xi1>
    %29 = stablehlo.convert %28 : (tensor<512x2x16xi1>) -> tensor<512x2x16xi32>
    %30 = stablehlo.multiply %21, %29 : tensor<512x2x16xi32>
    %31 = stablehlo.multiply %26, %30 : tensor<512x2x16xi32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %32 = stablehlo.reduce(%31 init: %c_4) applies stablehlo.add across dimensions = [2] : (tensor<512x2x16xi32>, tensor<i32>) -> tensor<512x2xi32>
    %33 = stablehlo.broadcast_in_dim %32, dims = [0, 1] : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %34 = stablehlo.convert %30 : (tensor<512x2x16xi32>) -> tensor<512x2x16xf32>
    %35 = stablehlo.convert %30 : (tensor<512x2x16xi32>) -> tensor<512x2x16xf32>
    %36 = stablehlo.reshape %indices : (tensor<512x2xi32>) -> tensor<1024xi32>
    %37 = stablehlo.iota dim = 0 : tensor<1024xi32>
    %c_5 = stablehlo.constant dense<0> : tensor<i32>
    %38 = stablehlo.broadcast_in_dim %c_5, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %39 = stablehlo.compare LT, %37, %38, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_6 = stablehlo.constant dense<1024> : tensor<i32>
    %40 = stablehlo.broadcast_in_dim %c_6, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %41 = stablehlo.add %37, %40 : tensor<1024xi32>
    %42 = stablehlo.select %39, %41, %37 : tensor<1024xi1>, tensor<1024xi32>
    %43 = stablehlo.broadcast_in_dim %42, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %44 = "stablehlo.gather"(%36, %43) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<1024xi32>, tensor<1024x1xi32>) -> tensor<1024xi32>
    %c_7 = stablehlo.constant dense<2> : tensor<i32>
    %45 = call @floor_divide(%37, %c_7) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_8 = stablehlo.constant dense<512> : tensor<i32>
    %46 = call @remainder(%45, %c_8) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_9 = stablehlo.constant dense<2> : tensor<i32>
    %47 = call @remainder(%37, %c_9) : (tensor<1024xi32>, tensor<i32>) -> tensor<1024xi32>
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %48 = stablehlo.broadcast_in_dim %c_10, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %49 = stablehlo.compare LT, %46, %48, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_11 = stablehlo.constant dense<512> : tensor<i32>
    %50 = stablehlo.broadcast_in_dim %c_11, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %51 = stablehlo.add %46, %50 : tensor<1024xi32>
    %52 = stablehlo.select %49, %51, %46 : tensor<1024xi1>, tensor<1024xi32>
    %c_12 = stablehlo.constant dense<0> : tensor<i32>
    %53 = stablehlo.broadcast_in_dim %c_12, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %54 = stablehlo.compare LT, %47, %53, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_13 = stablehlo.constant dense<2> : tensor<i32>
    %55 = stablehlo.broadcast_in_dim %c_13, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %56 = stablehlo.add %47, %55 : tensor<1024xi32>
    %57 = stablehlo.select %54, %56, %47 : tensor<1024xi1>, tensor<1024xi32>
    %58 = stablehlo.broadcast_in_dim %52, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %59 = stablehlo.broadcast_in_dim %57, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %60 = stablehlo.concatenate %58, %59, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %61 = "stablehlo.gather"(%32, %60) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<512x2xi32>, tensor<1024x2xi32>) -> tensor<1024xi32>
    %c_14 = stablehlo.constant dense<0> : tensor<i32>
    %62 = stablehlo.broadcast_in_dim %c_14, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %63 = stablehlo.subtract %61, %62 : tensor<1024xi32>
    %64 = stablehlo.transpose %34, dims = [0, 2, 1] : (tensor<512x2x16xf32>) -> tensor<512x16x2xf32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %c_16 = stablehlo.constant dense<511> : tensor<i32>
    %65 = call @clip(%46, %c_15, %c_16) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_17 = stablehlo.constant dense<0> : tensor<i32>
    %c_18 = stablehlo.constant dense<15> : tensor<i32>
    %66 = call @clip(%44, %c_17, %c_18) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_19 = stablehlo.constant dense<0> : tensor<i32>
    %67 = stablehlo.broadcast_in_dim %c_19, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %68 = stablehlo.compare LT, %65, %67, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_20 = stablehlo.constant dense<512> : tensor<i32>
    %69 = stablehlo.broadcast_in_dim %c_20, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %70 = stablehlo.add %65, %69 : tensor<1024xi32>
    %71 = stablehlo.select %68, %70, %65 : tensor<1024xi1>, tensor<1024xi32>
    %c_21 = stablehlo.constant dense<0> : tensor<i32>
    %72 = stablehlo.broadcast_in_dim %c_21, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %73 = stablehlo.compare LT, %66, %72, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_22 = stablehlo.constant dense<16> : tensor<i32>
    %74 = stablehlo.broadcast_in_dim %c_22, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %75 = stablehlo.add %66, %74 : tensor<1024xi32>
    %76 = stablehlo.select %73, %75, %66 : tensor<1024xi1>, tensor<1024xi32>
    %77 = stablehlo.broadcast_in_dim %71, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %78 = stablehlo.broadcast_in_dim %76, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %79 = stablehlo.concatenate %77, %78, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %80 = "stablehlo.gather"(%64, %79) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1, 2>}> : (tensor<512x16x2xf32>, tensor<1024x2xi32>) -> tensor<1024x2xf32>
    %81 = stablehlo.transpose %33, dims = [0, 2, 1] : (tensor<512x2x1xi32>) -> tensor<512x1x2xi32>
    %82 = stablehlo.reshape %81 : (tensor<512x1x2xi32>) -> tensor<512x2xi32>
    %c_23 = stablehlo.constant dense<0> : tensor<i32>
    %c_24 = stablehlo.constant dense<511> : tensor<i32>
    %83 = call @clip(%46, %c_23, %c_24) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_25 = stablehlo.constant dense<0> : tensor<i32>
    %84 = stablehlo.broadcast_in_dim %c_25, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %85 = stablehlo.compare LT, %83, %84, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_26 = stablehlo.constant dense<512> : tensor<i32>
    %86 = stablehlo.broadcast_in_dim %c_26, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %87 = stablehlo.add %83, %86 : tensor<1024xi32>
    %88 = stablehlo.select %85, %87, %83 : tensor<1024xi1>, tensor<1024xi32>
    %89 = stablehlo.broadcast_in_dim %88, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %90 = "stablehlo.gather"(%82, %89) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2>}> : (tensor<512x2xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %91 = stablehlo.reshape %63 : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %92 = stablehlo.broadcast_in_dim %91, dims = [0, 1] : (tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %93 = stablehlo.compare EQ, %90, %92, SIGNED : (tensor<1024x2xi32>, tensor<1024x2xi32>) -> tensor<1024x2xi1>
    %94 = stablehlo.convert %93 : (tensor<1024x2xi1>) -> tensor<1024x2xf32>
    %95 = stablehlo.dot_general %80, %94, batching_dims = [0] x [0], contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1024x2xf32>, tensor<1024x2xf32>) -> tensor<1024xf32>
    %cst_27 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %96 = stablehlo.broadcast_in_dim %cst_27, dims = [] : (tensor<f32>) -> tensor<1024xf32>
    %97 = stablehlo.compare NE, %95, %96, FLOAT : (tensor<1024xf32>, tensor<1024xf32>) -> tensor<1024xi1>
    %c_28 = stablehlo.constant dense<0> : tensor<i32>
    %98 = stablehlo.broadcast_in_dim %c_28, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %99 = stablehlo.compare GE, %63, %98, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %100 = stablehlo.and %97, %99 : tensor<1024xi1>
    %c_29 = stablehlo.constant dense<64> : tensor<i32>
    %101 = stablehlo.broadcast_in_dim %c_29, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %102 = stablehlo.compare LT, %63, %101, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %103 = stablehlo.and %100, %102 : tensor<1024xi1>
    %104 = stablehlo.reshape %103 : (tensor<1024xi1>) -> tensor<512x2xi1>
    %105 = stablehlo.transpose %35, dims = [0, 2, 1] : (tensor<512x2x16xf32>) -> tensor<512x16x2xf32>
    %c_30 = stablehlo.constant dense<0> : tensor<i32>
    %c_31 = stablehlo.constant dense<511> : tensor<i32>
    %106 = call @clip(%46, %c_30, %c_31) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_32 = stablehlo.constant dense<0> : tensor<i32>
    %c_33 = stablehlo.constant dense<15> : tensor<i32>
    %107 = call @clip(%44, %c_32, %c_33) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_34 = stablehlo.constant dense<0> : tensor<i32>
    %108 = stablehlo.broadcast_in_dim %c_34, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %109 = stablehlo.compare LT, %106, %108, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_35 = stablehlo.constant dense<512> : tensor<i32>
    %110 = stablehlo.broadcast_in_dim %c_35, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %111 = stablehlo.add %106, %110 : tensor<1024xi32>
    %112 = stablehlo.select %109, %111, %106 : tensor<1024xi1>, tensor<1024xi32>
    %c_36 = stablehlo.constant dense<0> : tensor<i32>
    %113 = stablehlo.broadcast_in_dim %c_36, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %114 = stablehlo.compare LT, %107, %113, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_37 = stablehlo.constant dense<16> : tensor<i32>
    %115 = stablehlo.broadcast_in_dim %c_37, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %116 = stablehlo.add %107, %115 : tensor<1024xi32>
    %117 = stablehlo.select %114, %116, %107 : tensor<1024xi1>, tensor<1024xi32>
    %118 = stablehlo.broadcast_in_dim %112, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %119 = stablehlo.broadcast_in_dim %117, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %120 = stablehlo.concatenate %118, %119, dim = 1 : (tensor<1024x1xi32>, tensor<1024x1xi32>) -> tensor<1024x2xi32>
    %121 = "stablehlo.gather"(%105, %120) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1, 2>}> : (tensor<512x16x2xf32>, tensor<1024x2xi32>) -> tensor<1024x2xf32>
    %c_38 = stablehlo.constant dense<0> : tensor<i32>
    %c_39 = stablehlo.constant dense<511> : tensor<i32>
    %122 = call @clip(%46, %c_38, %c_39) : (tensor<1024xi32>, tensor<i32>, tensor<i32>) -> tensor<1024xi32>
    %c_40 = stablehlo.constant dense<0> : tensor<i32>
    %123 = stablehlo.broadcast_in_dim %c_40, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %124 = stablehlo.compare LT, %122, %123, SIGNED : (tensor<1024xi32>, tensor<1024xi32>) -> tensor<1024xi1>
    %c_41 = stablehlo.constant dense<512> : tensor<i32>
    %125 = stablehlo.broadcast_in_dim %c_41, dims = [] : (tensor<i32>) -> tensor<1024xi32>
    %126 = stablehlo.add %122, %125 : tensor<1024xi32>
    %127 = stablehlo.select %124, %126, %122 : tensor<1024xi1>, tensor<1024xi32>
    %128 = stablehlo.broadcast_in_dim %127, dims = [0] : (tensor<1024xi32>) -> tensor<1024x1xi32>
    %129 = "stablehlo.gather"(%15, %128) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2>}> : (tensor<512x2xf32>, tensor<1024x1xi32>) -> tensor<1024x2xf32>
    %130 = stablehlo.dot_general %94, %129, batching_dims = [0, 1] x [0, 1], contracting_dims = [] x [], precision = [DEFAULT, DEFAULT] : (tensor<1024x2xf32>, tensor<1024x2xf32>) -> tensor<1024x2xf32>
    %131 = stablehlo.dot_general %121, %130, batching_dims = [0] x [0], contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1024x2xf32>, tensor<1024x2xf32>) -> tensor<1024xf32>
    %132 = stablehlo.reshape %131 : (tensor<1024xf32>) -> tensor<512x2xf32>
    %c_42 = stablehlo.constant dense<0> : tensor<i32>
    %133 = "stablehlo.case"(%c_42) ({
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %134:4 = "stablehlo.case"(%133) ({
      %154:5 = stablehlo.custom_call @jax_moe_ffi_dispatch_plan(%indices, %104) {backend_config = "", mhlo.backend_config = {align = 1 : i64, capacity = -1 : i64, chunk = 256 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>]} : (tensor<512x2xi32>, tensor<512x2xi1>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>, tensor<80xi32>)
      stablehlo.return %154#0, %154#1, %154#2, %154#3 : tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>
    }) : (tensor<i32>) -> (tensor<512x2xi32>, tensor<1024xi32>, tensor<16xi32>, tensor<16xi32>)
    %cst_43 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %135 = stablehlo.broadcast_in_dim %cst_43, dims = [] : (tensor<f32>) -> tensor<0xf32>
    %c_44 = stablehlo.constant dense<0> : tensor<i32>
    %136 = "stablehlo.case"(%c_44) ({
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %137 = "stablehlo.case"(%136) ({
      %154 = stablehlo.custom_call @jax_moe_ffi_dispatch(%arg4, %134#1, %135) {backend_config = "", mhlo.backend_config = {top_k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x256xf32>, tensor<1024xi32>, tensor<0xf32>) -> tensor<1024x256xf32>
      stablehlo.return %154 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %c_45 = stablehlo.constant dense<0> : tensor<i32>
    %138 = "stablehlo.case"(%c_45) ({
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %139 = "stablehlo.case"(%138) ({
      %154 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%137, %arg2, %134#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      stablehlo.return %154 : tensor<1024x512xf32>
    }) : (tensor<i32>) -> tensor<1024x512xf32>
    %140 = stablehlo.negate %139 : tensor<1024x512xf32>
    %141 = stablehlo.exponential %140 : tensor<1024x512xf32>
    %cst_46 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %142 = stablehlo.broadcast_in_dim %cst_46, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %143 = stablehlo.add %142, %141 : tensor<1024x512xf32>
    %cst_47 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %144 = stablehlo.broadcast_in_dim %cst_47, dims = [] : (tensor<f32>) -> tensor<1024x512xf32>
    %145 = stablehlo.divide %144, %143 : tensor<1024x512xf32>
    %146 = stablehlo.multiply %139, %145 : tensor<1024x512xf32>
    %c_48 = stablehlo.constant dense<0> : tensor<i32>
    %147 = "stablehlo.case"(%c_48) ({
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %148 = "stablehlo.case"(%147) ({
      %154 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%137, %arg3, %134#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<16x256x512xf32>, tensor<16xi32>) -> tensor<1024x512xf32>
      stablehlo.return %154 : tensor<1024x512xf32>
    }) : (tensor<i32>) -> tensor<1024x512xf32>
    %149 = stablehlo.multiply %146, %148 : tensor<1024x512xf32>
    %c_49 = stablehlo.constant dense<0> : tensor<i32>
    %150 = "stablehlo.case"(%c_49) ({
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %151 = "stablehlo.case"(%150) ({
      %154 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%149, %arg1, %134#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x512xf32>, tensor<16x512x256xf32>, tensor<16xi32>) -> tensor<1024x256xf32>
      stablehlo.return %154 : tensor<1024x256xf32>
    }) : (tensor<i32>) -> tensor<1024x256xf32>
    %c_50 = stablehlo.constant dense<0> : tensor<i32>
    %152 = "stablehlo.case"(%c_50) ({
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }, {
      %c_51 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_51 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %153 = "stablehlo.case"(%152) ({
      %154 = stablehlo.custom_call @jax_moe_ffi_combine(%151, %134#0, %132) {backend_config = "", mhlo.backend_config = {}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<1024x256xf32>, tensor<512x2xi32>, tensor<512x2xf32>) -> tensor<512x256xf32>
      stablehlo.return %154 : tensor<512x256xf32>
    }) : (tensor<i32>) -> tensor<512x256xf32>
    return %153 : tensor<512x256xf32>
  }
  func.func private @cumsum(%arg0: tensor<1024x16xi32>) -> tensor<1024x16xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<i32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1, 1>, padding = dense<[[1023, 0], [0, 0]]> : tensor<2x2xi64>, window_dilations = array<i64: 1, 1>, window_dimensions = array<i64: 1024, 1>, window_strides = array<i64: 1, 1>}> ({
    ^bb0(%arg1: tensor<i32>, %arg2: tensor<i32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<i32>
      stablehlo.return %2 : tensor<i32>
    }) : (tensor<1024x16xi32>, tensor<i32>) -> tensor<1024x16xi32>
    return %1 : tensor<1024x16xi32>
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
}
