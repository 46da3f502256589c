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
    %16 = call @_one_hot(%indices) : (tensor<512x2xi32>) -> tensor<512x2x16xi32>
    %17 = stablehlo.reshape %16 : (tensor<512x2x16xi32>) -> tensor<1024x16xi32>
    %18 = call @cumsum(%17) : (tensor<1024x16xi32>) -> tensor<1024x16xi32>
    %c = stablehlo.constant dense<1> : tensor<i32>
    %19 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<1024x16xi32>
    %20 = stablehlo.subtract %18, %19 : tensor<1024x16xi32>
    %21 = stablehlo.reshape %20 : (tensor<1024x16xi32>) -> tensor<512x2x16xi32>
    %c_3 = stablehlo.constant dense<64> : tensor<i32>
    %22 = stablehlo.broadcast_in_dim %c_3, dims = [] : (tensor<i32>) -> tensor<512x2x16xi32>
    %23 = stablehlo.compare LT, %21, %22, SIGNED : (tensor<512x2x16xi32>, tensor<512x2x16xi32>) -> tensor<512x2x16xi1>
    %24 = stablehlo.convert %23 : (tensor<512x2x16xi1>) -> tensor<512x2x16xi32>
    %25 = stablehlo.multiply %16, %24 : tensor<512x2x16xi32>
    %26 = stablehlo.multiply %21, %25 : tensor<512x2x16xi32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %27 = stablehlo.reduce(%26 init: %c_4) applies stablehlo.add across dimensions = [2] : (tensor<512x2x16xi32>, tensor<i32>) -> tensor<512x2xi32>
    %28 = call @_one_hot_1(%27) : (tensor<512x2xi32>) -> tensor<512x2x64xf32>
    %29 = stablehlo.convert %25 : (tensor<512x2x16xi32>) -> tensor<512x2x16xf32>
    %30 = stablehlo.dot_general %29, %28, batching_dims = [0] x [0], contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<512x2x16xf32>, tensor<512x2x64xf32>) -> tensor<512x16x64xf32>
    %31 = stablehlo.convert %25 : (tensor<512x2x16xi32>) -> tensor<512x2x16xf32>
    %32 = stablehlo.dot_general %28, %15, batching_dims = [0, 1] x [0, 1], contracting_dims = [] x [], precision = [DEFAULT, DEFAULT] : (tensor<512x2x64xf32>, tensor<512x2xf32>) -> tensor<512x2x64xf32>
    %33 = stablehlo.dot_general %31, %32, batching_dims = [0] x [0], contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<512x2x16xf32>, tensor<512x2x64xf32>) -> tensor<512x16x64xf32>
    %34 = stablehlo.dot_general %30, %arg4, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<512x16x64xf32>, tensor<512x256xf32>) -> tensor<16x64x256xf32>
    %35 = stablehlo.dot_general %34, %arg2, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<16x64x256xf32>, tensor<16x256x512xf32>) -> tensor<16x64x512xf32>
    %36 = call @silu(%35) : (tensor<16x64x512xf32>) -> tensor<16x64x512xf32>
    %37 = stablehlo.dot_general %34, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<16x64x256xf32>, tensor<16x256x512xf32>) -> tensor<16x64x512xf32>
    %38 = stablehlo.multiply %36, %37 : tensor<16x64x512xf32>
    %39 = stablehlo.dot_general %38, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<16x64x512xf32>, tensor<16x512x256xf32>) -> tensor<16x64x256xf32>
    %40 = stablehlo.dot_general %33, %39, contracting_dims = [2, 1] x [1, 0], precision = [DEFAULT, DEFAULT] : (tensor<512x16x64xf32>, tensor<16x64x256xf32>) -> tensor<512x256xf32>
    return %40 : tensor<512x256xf32>
  }
  func.func private @_one_hot(%arg0: tensor<512x2xi32>) -> tensor<512x2x16xi32> {
    %0 = stablehlo.broadcast_in_dim %arg0, dims = [0, 1] : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %1 = stablehlo.iota dim = 2 : tensor<1x1x16xi32>
    %2 = stablehlo.broadcast_in_dim %0, dims = [0, 1, 2] : (tensor<512x2x1xi32>) -> tensor<512x2x16xi32>
    %3 = stablehlo.broadcast_in_dim %1, dims = [0, 1, 2] : (tensor<1x1x16xi32>) -> tensor<512x2x16xi32>
    %4 = stablehlo.compare EQ, %2, %3, SIGNED : (tensor<512x2x16xi32>, tensor<512x2x16xi32>) -> tensor<512x2x16xi1>
    %5 = stablehlo.convert %4 : (tensor<512x2x16xi1>) -> tensor<512x2x16xi32>
    return %5 : tensor<512x2x16xi32>
  }
  func.func private @cumsum(%arg0: tensor<1024x16xi32>) -> tensor<1024x16xi32> {
    %0 = call @cumsum_0(%arg0) : (tensor<1024x16xi32>) -> tensor<1024x16xi32>
    return %0 : tensor<1024x16xi32>
  }
  func.func private @cumsum_0(%arg0: tensor<1024x16xi32>) -> tensor<1024x16xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<i32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1, 1>, padding = dense<[[1023, 0], [0, 0]]> : tensor<2x2xi64>, window_dilations = array<i64: 1, 1>, window_dimensions = array<i64: 1024, 1>, window_strides = array<i64: 1, 1>}> ({
    ^bb0(%arg1: tensor<i32>, %arg2: tensor<i32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<i32>
      stablehlo.return %2 : tensor<i32>
    }) : (tensor<1024x16xi32>, tensor<i32>) -> tensor<1024x16xi32>
    return %1 : tensor<1024x16xi32>
  }
  func.func private @_one_hot_1(%arg0: tensor<512x2xi32>) -> tensor<512x2x64xf32> {
    %0 = stablehlo.broadcast_in_dim %arg0, dims = [0, 1] : (tensor<512x2xi32>) -> tensor<512x2x1xi32>
    %1 = stablehlo.iota dim = 2 : tensor<1x1x64xi32>
    %2 = stablehlo.broadcast_in_dim %0, dims = [0, 1, 2] : (tensor<512x2x1xi32>) -> tensor<512x2x64xi32>
    %3 = stablehlo.broadcast_in_dim %1, dims = [0, 1, 2] : (tensor<1x1x64xi32>) -> tensor<512x2x64xi32>
    %4 = stablehlo.compare EQ, %2, %3, SIGNED : (tensor<512x2x64xi32>, tensor<512x2x64xi32>) -> tensor<512x2x64xi1>
    %5 = stablehlo.convert %4 : (tensor<512x2x64xi1>) -> tensor<512x2x64xf32>
    return %5 : tensor<512x2x64xf32>
  }
  func.func private @silu(%arg0: tensor<16x64x512xf32>) -> tensor<16x64x512xf32> {
    %0 = stablehlo.negate %arg0 : tensor<16x64x512xf32>
    %1 = stablehlo.exponential %0 : tensor<16x64x512xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<16x64x512xf32>
    %3 = stablehlo.add %2, %1 : tensor<16x64x512xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %4 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<16x64x512xf32>
    %5 = stablehlo.divide %4, %3 : tensor<16x64x512xf32>
    %6 = stablehlo.multiply %arg0, %5 : tensor<16x64x512xf32>
    return %6 : tensor<16x64x512xf32>
  }
}
