module @jit__lambda attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x128x8xf32>, %arg1: tensor<2x8x256x128xf32>, %arg2: tensor<2x8x128x256xf32>, %arg3: tensor<2x8x128x256xf32>, %arg4: tensor<256x128xf32>) -> (tensor<256x128xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0:6 = stablehlo.while(%iterArg = %arg0, %iterArg_0 = %arg1, %iterArg_1 = %arg2, %iterArg_2 = %arg3, %iterArg_3 = %c, %iterArg_4 = %arg4) : tensor<2x128x8xf32>, tensor<2x8x256x128xf32>, tensor<2x8x128x256xf32>, tensor<2x8x128x256xf32>, tensor<i32>, tensor<256x128xf32>
    cond {
      %c_5 = stablehlo.constant dense<2> : tensor<i32>
      %1 = stablehlo.compare LT, %iterArg_3, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %1 : tensor<i1>
    } do {
      %1 = func.call @dynamic_index_in_dim(%iterArg, %iterArg_3) : (tensor<2x128x8xf32>, tensor<i32>) -> tensor<128x8xf32>
      %2 = func.call @dynamic_index_in_dim_0(%iterArg_0, %iterArg_3) : (tensor<2x8x256x128xf32>, tensor<i32>) -> tensor<8x256x128xf32>
      %3 = func.call @dynamic_index_in_dim_1(%iterArg_1, %iterArg_3) : (tensor<2x8x128x256xf32>, tensor<i32>) -> tensor<8x128x256xf32>
      %4 = func.call @dynamic_index_in_dim_1(%iterArg_2, %iterArg_3) : (tensor<2x8x128x256xf32>, tensor<i32>) -> tensor<8x128x256xf32>
      %5 = func.call @closed_call(%iterArg_4, %1, %2, %3, %4) : (tensor<256x128xf32>, tensor<128x8xf32>, tensor<8x256x128xf32>, tensor<8x128x256xf32>, tensor<8x128x256xf32>) -> tensor<256x128xf32>
      %c_5 = stablehlo.constant dense<1> : tensor<i32>
      %6 = stablehlo.add %iterArg_3, %c_5 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_0, %iterArg_1, %iterArg_2, %6, %5 : tensor<2x128x8xf32>, tensor<2x8x256x128xf32>, tensor<2x8x128x256xf32>, tensor<2x8x128x256xf32>, tensor<i32>, tensor<256x128xf32>
    }
    return %0#5 : tensor<256x128xf32>
  }
  func.func private @dynamic_index_in_dim(%arg0: tensor<2x128x8xf32>, %arg1: tensor<i32>) -> tensor<128x8xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, sizes = [1, 128, 8] : (tensor<2x128x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x128x8xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x128x8xf32>) -> tensor<128x8xf32>
    return %1 : tensor<128x8xf32>
  }
  func.func private @dynamic_index_in_dim_0(%arg0: tensor<2x8x256x128xf32>, %arg1: tensor<i32>) -> tensor<8x256x128xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, %c_1, sizes = [1, 8, 256, 128] : (tensor<2x8x256x128xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x8x256x128xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x8x256x128xf32>) -> tensor<8x256x128xf32>
    return %1 : tensor<8x256x128xf32>
  }
  func.func private @dynamic_index_in_dim_1(%arg0: tensor<2x8x128x256xf32>, %arg1: tensor<i32>) -> tensor<8x128x256xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, %c_1, sizes = [1, 8, 128, 256] : (tensor<2x8x128x256xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x8x128x256xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x8x128x256xf32>) -> tensor<8x128x256xf32>
    return %1 : tensor<8x128x256xf32>
  }
  func.func private @closed_call(%arg0: tensor<256x128xf32>, %arg1: tensor<128x8xf32>, %arg2: tensor<8x256x128xf32>, %arg3: tensor<8x128x256xf32>, %arg4: tensor<8x128x256xf32>) -> tensor<256x128xf32> {
    %0 = stablehlo.multiply %arg0, %arg0 : tensor<256x128xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<256x128xf32>, tensor<f32>) -> tensor<256xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<256xf32>) -> tensor<256x1xf32>
    %cst_0 = stablehlo.constant dense<1.280000e+02> : tensor<f32>
    %3 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<256x1xf32>
    %4 = stablehlo.divide %2, %3 : tensor<256x1xf32>
    %cst_1 = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %5 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<256x1xf32>
    %6 = stablehlo.add %4, %5 : tensor<256x1xf32>
    %7 = stablehlo.sqrt %6 : tensor<256x1xf32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x128xf32>
    %9 = stablehlo.divide %arg0, %8 : tensor<256x128xf32>
    %10 = stablehlo.dot_general %9, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<256x128xf32>, tensor<128x8xf32>) -> tensor<256x8xf32>
    %cst_2 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %11 = stablehlo.reduce(%10 init: %cst_2) applies stablehlo.maximum across dimensions = [1] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256xf32>
    %cst_3 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %13 = stablehlo.maximum %12, %11 : tensor<256xf32>
    %14 = stablehlo.broadcast_in_dim %13, dims = [0] : (tensor<256xf32>) -> tensor<256x1xf32>
    %15 = stablehlo.broadcast_in_dim %14, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x8xf32>
    %16 = stablehlo.subtract %10, %15 : tensor<256x8xf32>
    %17 = stablehlo.exponential %16 : tensor<256x8xf32>
    %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %18 = stablehlo.reduce(%17 init: %cst_4) applies stablehlo.add across dimensions = [1] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256xf32>
    %19 = stablehlo.broadcast_in_dim %18, dims = [0] : (tensor<256xf32>) -> tensor<256x1xf32>
    %20 = stablehlo.broadcast_in_dim %19, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x8xf32>
    %21 = stablehlo.divide %17, %20 : tensor<256x8xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %22 = "stablehlo.case"(%c) ({
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %23:2 = "stablehlo.case"(%22) ({
      %103:2 = stablehlo.custom_call @jax_moe_ffi_top_k(%21) {backend_config = "", mhlo.backend_config = {k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]} : (tensor<256x8xf32>) -> (tensor<256x2xf32>, tensor<256x2xi32>)
      stablehlo.return %103#0, %103#1 : tensor<256x2xf32>, tensor<256x2xi32>
    }) : (tensor<i32>) -> (tensor<256x2xf32>, tensor<256x2xi32>)
    %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %24 = stablehlo.reduce(%23#0 init: %cst_5) applies stablehlo.add across dimensions = [1] : (tensor<256x2xf32>, tensor<f32>) -> tensor<256xf32>
    %25 = stablehlo.broadcast_in_dim %24, dims = [0] : (tensor<256xf32>) -> tensor<256x1xf32>
    %26 = stablehlo.broadcast_in_dim %25, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x2xf32>
    %27 = stablehlo.divide %23#0, %26 : tensor<256x2xf32>
    %28 = stablehlo.broadcast_in_dim %23#1, dims = [0, 1] : (tensor<256x2xi32>) -> tensor<256x2x1xi32>
    %29 = stablehlo.iota dim = 2 : tensor<1x1x8xi32>
    %30 = stablehlo.broadcast_in_dim %28, dims = [0, 1, 2] : (tensor<256x2x1xi32>) -> tensor<256x2x8xi32>
    %31 = stablehlo.broadcast_in_dim %29, dims = [0, 1, 2] : (tensor<1x1x8xi32>) -> tensor<256x2x8xi32>
    %32 = stablehlo.compare EQ, %30, %31, SIGNED : (tensor<256x2x8xi32>, tensor<256x2x8xi32>) -> tensor<256x2x8xi1>
    %33 = stablehlo.convert %32 : (tensor<256x2x8xi1>) -> tensor<256x2x8xf32>
    %34 = stablehlo.broadcast_in_dim %27, dims = [0, 1] : (tensor<256x2xf32>) -> tensor<256x2x1xf32>
    %35 = stablehlo.broadcast_in_dim %34, dims = [0, 1, 2] : (tensor<256x2x1xf32>) -> tensor<256x2x8xf32>
    %36 = stablehlo.multiply %33, %35 : tensor<256x2x8xf32>
    %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %37 = stablehlo.reduce(%36 init: %cst_6) applies stablehlo.add across dimensions = [1] : (tensor<256x2x8xf32>, tensor<f32>) -> tensor<256x8xf32>
    %38 = stablehlo.reshape %23#1 : (tensor<256x2xi32>) -> tensor<512xi32>
    %39 = stablehlo.iota dim = 0 : tensor<512xi32>
    %c_7 = stablehlo.constant dense<0> : tensor<i32>
    %40 = stablehlo.broadcast_in_dim %c_7, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %41 = stablehlo.compare LT, %39, %40, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %c_8 = stablehlo.constant dense<512> : tensor<i32>
    %42 = stablehlo.broadcast_in_dim %c_8, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %43 = stablehlo.add %39, %42 : tensor<512xi32>
    %44 = stablehlo.select %41, %43, %39 : tensor<512xi1>, tensor<512xi32>
    %45 = stablehlo.broadcast_in_dim %44, dims = [0] : (tensor<512xi32>) -> tensor<512x1xi32>
    %46 = "stablehlo.gather"(%38, %45) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<512xi32>, tensor<512x1xi32>) -> tensor<512xi32>
    %c_9 = stablehlo.constant dense<2> : tensor<i32>
    %47 = call @floor_divide(%39, %c_9) : (tensor<512xi32>, tensor<i32>) -> tensor<512xi32>
    %c_10 = stablehlo.constant dense<256> : tensor<i32>
    %48 = call @remainder(%47, %c_10) : (tensor<512xi32>, tensor<i32>) -> tensor<512xi32>
    %c_11 = stablehlo.constant dense<0> : tensor<i32>
    %c_12 = stablehlo.constant dense<255> : tensor<i32>
    %49 = call @clip(%48, %c_11, %c_12) : (tensor<512xi32>, tensor<i32>, tensor<i32>) -> tensor<512xi32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %c_14 = stablehlo.constant dense<7> : tensor<i32>
    %50 = call @clip(%46, %c_13, %c_14) : (tensor<512xi32>, tensor<i32>, tensor<i32>) -> tensor<512xi32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %51 = stablehlo.broadcast_in_dim %c_15, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %52 = stablehlo.compare LT, %49, %51, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %c_16 = stablehlo.constant dense<256> : tensor<i32>
    %53 = stablehlo.broadcast_in_dim %c_16, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %54 = stablehlo.add %49, %53 : tensor<512xi32>
    %55 = stablehlo.select %52, %54, %49 : tensor<512xi1>, tensor<512xi32>
    %c_17 = stablehlo.constant dense<0> : tensor<i32>
    %56 = stablehlo.broadcast_in_dim %c_17, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %57 = stablehlo.compare LT, %50, %56, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %c_18 = stablehlo.constant dense<8> : tensor<i32>
    %58 = stablehlo.broadcast_in_dim %c_18, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %59 = stablehlo.add %50, %58 : tensor<512xi32>
    %60 = stablehlo.select %57, %59, %50 : tensor<512xi1>, tensor<512xi32>
    %61 = stablehlo.broadcast_in_dim %55, dims = [0] : (tensor<512xi32>) -> tensor<512x1xi32>
    %62 = stablehlo.broadcast_in_dim %60, dims = [0] : (tensor<512xi32>) -> tensor<512x1xi32>
    %63 = stablehlo.concatenate %61, %62, dim = 1 : (tensor<512x1xi32>, tensor<512x1xi32>) -> tensor<512x2xi32>
    %64 = "stablehlo.gather"(%37, %63) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<256x8xf32>, tensor<512x2xi32>) -> tensor<512xf32>
    %65 = stablehlo.reshape %64 : (tensor<512xf32>) -> tensor<256x2xf32>
    %c_19 = stablehlo.constant dense<false> : tensor<i1>
    %66 = stablehlo.broadcast_in_dim %c_19, dims = [] : (tensor<i1>) -> tensor<0xi1>
    %c_20 = stablehlo.constant dense<0> : tensor<i32>
    %67 = "stablehlo.case"(%c_20) ({
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %68:4 = "stablehlo.case"(%67) ({
      %103:5 = stablehlo.custom_call @jax_moe_ffi_dispatch_plan(%23#1, %66) {backend_config = "", mhlo.backend_config = {align = 1 : i64, capacity = -1 : i64, chunk = 256 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>]} : (tensor<256x2xi32>, tensor<0xi1>) -> (tensor<256x2xi32>, tensor<512xi32>, tensor<8xi32>, tensor<8xi32>, tensor<25xi32>)
      stablehlo.return %103#0, %103#1, %103#2, %103#3 : tensor<256x2xi32>, tensor<512xi32>, tensor<8xi32>, tensor<8xi32>
    }) : (tensor<i32>) -> (tensor<256x2xi32>, tensor<512xi32>, tensor<8xi32>, tensor<8xi32>)
    %cst_21 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %69 = stablehlo.broadcast_in_dim %cst_21, dims = [] : (tensor<f32>) -> tensor<0xf32>
    %c_22 = stablehlo.constant dense<0> : tensor<i32>
    %70 = "stablehlo.case"(%c_22) ({
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %71 = "stablehlo.case"(%70) ({
      %103 = stablehlo.custom_call @jax_moe_ffi_dispatch(%9, %68#0, %68#1, %69) {backend_config = "", mhlo.backend_config = {top_k = 2 : i64}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<256x128xf32>, tensor<256x2xi32>, tensor<512xi32>, tensor<0xf32>) -> tensor<512x128xf32>
      stablehlo.return %103 : tensor<512x128xf32>
    }) : (tensor<i32>) -> tensor<512x128xf32>
    %c_23 = stablehlo.constant dense<0> : tensor<i32>
    %72 = stablehlo.broadcast_in_dim %c_23, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %73 = stablehlo.compare GE, %68#1, %72, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %74 = stablehlo.reshape %65 : (tensor<256x2xf32>) -> tensor<512xf32>
    %c_24 = stablehlo.constant dense<0> : tensor<i32>
    %75 = stablehlo.broadcast_in_dim %c_24, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %76 = stablehlo.maximum %68#1, %75 : tensor<512xi32>
    %c_25 = stablehlo.constant dense<0> : tensor<i32>
    %77 = stablehlo.broadcast_in_dim %c_25, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %78 = stablehlo.compare LT, %76, %77, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %c_26 = stablehlo.constant dense<512> : tensor<i32>
    %79 = stablehlo.broadcast_in_dim %c_26, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %80 = stablehlo.add %76, %79 : tensor<512xi32>
    %81 = stablehlo.select %78, %80, %76 : tensor<512xi1>, tensor<512xi32>
    %82 = stablehlo.broadcast_in_dim %81, dims = [0] : (tensor<512xi32>) -> tensor<512x1xi32>
    %83 = "stablehlo.gather"(%74, %82) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>}> : (tensor<512xf32>, tensor<512x1xi32>) -> tensor<512xf32>
    %cst_27 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %84 = call @_where_3(%73, %83, %cst_27) : (tensor<512xi1>, tensor<512xf32>, tensor<f32>) -> tensor<512xf32>
    %c_28 = stablehlo.constant dense<0> : tensor<i32>
    %85 = "stablehlo.case"(%c_28) ({
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %86:2 = "stablehlo.case"(%85) ({
      %103 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%71, %arg3, %68#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x128xf32>, tensor<8x128x256xf32>, tensor<8xi32>) -> tensor<512x256xf32>
      %104 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%71, %arg4, %68#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x128xf32>, tensor<8x128x256xf32>, tensor<8xi32>) -> tensor<512x256xf32>
      stablehlo.return %103, %104 : tensor<512x256xf32>, tensor<512x256xf32>
    }) : (tensor<i32>) -> (tensor<512x256xf32>, tensor<512x256xf32>)
    %87 = stablehlo.negate %86#0 : tensor<512x256xf32>
    %88 = stablehlo.exponential %87 : tensor<512x256xf32>
    %cst_29 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %89 = stablehlo.broadcast_in_dim %cst_29, dims = [] : (tensor<f32>) -> tensor<512x256xf32>
    %90 = stablehlo.add %89, %88 : tensor<512x256xf32>
    %cst_30 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %91 = stablehlo.broadcast_in_dim %cst_30, dims = [] : (tensor<f32>) -> tensor<512x256xf32>
    %92 = stablehlo.divide %91, %90 : tensor<512x256xf32>
    %93 = stablehlo.multiply %86#0, %92 : tensor<512x256xf32>
    %94 = stablehlo.multiply %93, %86#1 : tensor<512x256xf32>
    %95 = stablehlo.broadcast_in_dim %84, dims = [0] : (tensor<512xf32>) -> tensor<512x1xf32>
    %96 = stablehlo.broadcast_in_dim %95, dims = [0, 1] : (tensor<512x1xf32>) -> tensor<512x256xf32>
    %97 = stablehlo.multiply %94, %96 : tensor<512x256xf32>
    %c_31 = stablehlo.constant dense<0> : tensor<i32>
    %98 = "stablehlo.case"(%c_31) ({
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }, {
      %c_32 = stablehlo.constant dense<0> : tensor<i32>
      stablehlo.return %c_32 : tensor<i32>
    }) : (tensor<i32>) -> tensor<i32>
    %99 = "stablehlo.case"(%98) ({
      %103 = stablehlo.custom_call @jax_moe_ffi_grouped_gemm(%97, %arg2, %68#3) {backend_config = "", mhlo.backend_config = {transpose_rhs = false}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x256xf32>, tensor<8x256x128xf32>, tensor<8xi32>) -> tensor<512x128xf32>
      stablehlo.return %103 : tensor<512x128xf32>
    }) : (tensor<i32>) -> tensor<512x128xf32>
    %100 = call @compute_on(%68#0, %68#1, %68#2, %68#3, %99) {mhlo.frontend_attributes = {_xla_stream_annotation = "2", inlineable = "false"}} : (tensor<256x2xi32>, tensor<512xi32>, tensor<8xi32>, tensor<8xi32>, tensor<512x128xf32>) -> tensor<256x128xf32>
    %101 = stablehlo.custom_call @annotate_device_placement(%100) {backend_config = "", has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<256x128xf32>) -> tensor<256x128xf32>
    %102 = stablehlo.add %arg0, %101 : tensor<256x128xf32>
    return %102 : tensor<256x128xf32>
  }
  func.func private @floor_divide(%arg0: tensor<512xi32>, %arg1: tensor<i32>) -> tensor<512xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %2 = stablehlo.divide %arg0, %1 : tensor<512xi32>
    %3 = stablehlo.sign %arg0 : tensor<512xi32>
    %4 = stablehlo.sign %0 : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %6 = stablehlo.compare NE, %3, %5, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %7 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %8 = stablehlo.remainder %arg0, %7 : tensor<512xi32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %10 = stablehlo.compare NE, %8, %9, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %11 = stablehlo.and %6, %10 : tensor<512xi1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %12 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %13 = stablehlo.subtract %2, %12 : tensor<512xi32>
    %14 = call @_where(%11, %13, %2) : (tensor<512xi1>, tensor<512xi32>, tensor<512xi32>) -> tensor<512xi32>
    return %14 : tensor<512xi32>
  }
  func.func private @_where(%arg0: tensor<512xi1>, %arg1: tensor<512xi32>, %arg2: tensor<512xi32>) -> tensor<512xi32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<512xi1>, tensor<512xi32>
    return %0 : tensor<512xi32>
  }
  func.func private @remainder(%arg0: tensor<512xi32>, %arg1: tensor<i32>) -> tensor<512xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where_2(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %4 = stablehlo.remainder %arg0, %3 : tensor<512xi32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.broadcast_in_dim %c_1, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %6 = stablehlo.compare NE, %4, %5, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %7 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %8 = stablehlo.compare LT, %4, %7, SIGNED : (tensor<512xi32>, tensor<512xi32>) -> tensor<512xi1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %10 = stablehlo.broadcast_in_dim %9, dims = [] : (tensor<i1>) -> tensor<512xi1>
    %11 = stablehlo.compare NE, %8, %10, UNSIGNED : (tensor<512xi1>, tensor<512xi1>) -> tensor<512xi1>
    %12 = stablehlo.and %11, %6 : tensor<512xi1>
    %13 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %14 = stablehlo.add %4, %13 : tensor<512xi32>
    %15 = stablehlo.select %12, %14, %4 : tensor<512xi1>, tensor<512xi32>
    return %15 : tensor<512xi32>
  }
  func.func private @_where_2(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @clip(%arg0: tensor<512xi32>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<512xi32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %2 = stablehlo.maximum %1, %arg0 : tensor<512xi32>
    %3 = stablehlo.convert %arg2 : tensor<i32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<i32>) -> tensor<512xi32>
    %5 = stablehlo.minimum %4, %2 : tensor<512xi32>
    return %5 : tensor<512xi32>
  }
  func.func private @_where_3(%arg0: tensor<512xi1>, %arg1: tensor<512xf32>, %arg2: tensor<f32>) -> tensor<512xf32> {
    %0 = stablehlo.convert %arg2 : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<512xf32>
    %2 = stablehlo.select %arg0, %arg1, %1 : tensor<512xi1>, tensor<512xf32>
    return %2 : tensor<512xf32>
  }
  func.func private @compute_on(%arg0: tensor<256x2xi32>, %arg1: tensor<512xi32>, %arg2: tensor<8xi32>, %arg3: tensor<8xi32>, %arg4: tensor<512x128xf32>) -> tensor<256x128xf32> {
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<256x2xf32>
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
      %3 = stablehlo.custom_call @jax_moe_ffi_combine(%arg4, %arg0, %0) {backend_config = "", mhlo.backend_config = {}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<512x128xf32>, tensor<256x2xi32>, tensor<256x2xf32>) -> tensor<256x128xf32>
      stablehlo.return %3 : tensor<256x128xf32>
    }) : (tensor<i32>) -> tensor<256x128xf32>
    return %2 : tensor<256x128xf32>
  }
}
