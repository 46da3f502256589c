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
    %values, %indices = chlo.top_k(%21, k = 2) : tensor<256x8xf32> -> (tensor<256x2xf32>, tensor<256x2xi32>)
    %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %22 = stablehlo.reduce(%values init: %cst_5) applies stablehlo.add across dimensions = [1] : (tensor<256x2xf32>, tensor<f32>) -> tensor<256xf32>
    %23 = stablehlo.broadcast_in_dim %22, dims = [0] : (tensor<256xf32>) -> tensor<256x1xf32>
    %24 = stablehlo.broadcast_in_dim %23, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x2xf32>
    %25 = stablehlo.divide %values, %24 : tensor<256x2xf32>
    %26 = call @_one_hot(%indices) : (tensor<256x2xi32>) -> tensor<256x2x8xf32>
    %27 = stablehlo.broadcast_in_dim %25, dims = [0, 1] : (tensor<256x2xf32>) -> tensor<256x2x1xf32>
    %28 = stablehlo.broadcast_in_dim %27, dims = [0, 1, 2] : (tensor<256x2x1xf32>) -> tensor<256x2x8xf32>
    %29 = stablehlo.multiply %26, %28 : tensor<256x2x8xf32>
    %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %30 = stablehlo.reduce(%29 init: %cst_6) applies stablehlo.add across dimensions = [1] : (tensor<256x2x8xf32>, tensor<f32>) -> tensor<256x8xf32>
    %31 = stablehlo.dot_general %9, %arg3, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<256x128xf32>, tensor<8x128x256xf32>) -> tensor<256x8x256xf32>
    %32 = call @silu(%31) : (tensor<256x8x256xf32>) -> tensor<256x8x256xf32>
    %33 = stablehlo.dot_general %9, %arg4, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<256x128xf32>, tensor<8x128x256xf32>) -> tensor<256x8x256xf32>
    %34 = stablehlo.multiply %32, %33 : tensor<256x8x256xf32>
    %35 = stablehlo.dot_general %arg2, %34, batching_dims = [0] x [1], contracting_dims = [1] x [2], precision = [DEFAULT, DEFAULT] : (tensor<8x256x128xf32>, tensor<256x8x256xf32>) -> tensor<8x128x256xf32>
    %36 = stablehlo.transpose %35, dims = [2, 0, 1] : (tensor<8x128x256xf32>) -> tensor<256x8x128xf32>
    %37 = stablehlo.dot_general %36, %30, batching_dims = [0] x [0], contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<256x8x128xf32>, tensor<256x8xf32>) -> tensor<256x128xf32>
    %38 = stablehlo.add %arg0, %37 : tensor<256x128xf32>
    return %38 : tensor<256x128xf32>
  }
  func.func private @_one_hot(%arg0: tensor<256x2xi32>) -> tensor<256x2x8xf32> {
    %0 = stablehlo.broadcast_in_dim %arg0, dims = [0, 1] : (tensor<256x2xi32>) -> tensor<256x2x1xi32>
    %1 = stablehlo.iota dim = 2 : tensor<1x1x8xi32>
    %2 = stablehlo.broadcast_in_dim %0, dims = [0, 1, 2] : (tensor<256x2x1xi32>) -> tensor<256x2x8xi32>
    %3 = stablehlo.broadcast_in_dim %1, dims = [0, 1, 2] : (tensor<1x1x8xi32>) -> tensor<256x2x8xi32>
    %4 = stablehlo.compare EQ, %2, %3, SIGNED : (tensor<256x2x8xi32>, tensor<256x2x8xi32>) -> tensor<256x2x8xi1>
    %5 = stablehlo.convert %4 : (tensor<256x2x8xi1>) -> tensor<256x2x8xf32>
    return %5 : tensor<256x2x8xf32>
  }
  func.func private @silu(%arg0: tensor<256x8x256xf32>) -> tensor<256x8x256xf32> {
    %0 = stablehlo.negate %arg0 : tensor<256x8x256xf32>
    %1 = stablehlo.exponential %0 : tensor<256x8x256xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<256x8x256xf32>
    %3 = stablehlo.add %2, %1 : tensor<256x8x256xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %4 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<256x8x256xf32>
    %5 = stablehlo.divide %4, %3 : tensor<256x8x256xf32>
    %6 = stablehlo.multiply %arg0, %5 : tensor<256x8x256xf32>
    return %6 : tensor<256x8x256xf32>
  }
}
