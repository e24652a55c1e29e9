#loc = loc(unknown)
#loc2 = loc("/work/main/tools/gen_lowering.py":222:0)
#loc4 = loc("mean"(#loc2))
#loc6 = loc("cumsum"(#loc2))
module {
  func.func @main(%arg0: tensor<20x8xf32> loc(unknown), %arg1: tensor<2x5xi64> loc(unknown)) -> (tensor<2x8xf32>, tensor<8x2x5xf32>, tensor<2x5x8xf32>) {
    %0 = "stablehlo.gather"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>} : (tensor<20x8xf32>, tensor<2x5xi64>) -> tensor<2x5x8xf32> loc(#loc3)
    %1 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc4)
    %2 = "stablehlo.reduce"(%0, %1) ({
    ^bb0(%arg2: tensor<f32> loc("mean"(#loc2)), %arg3: tensor<f32> loc("mean"(#loc2))):
      %10 = "stablehlo.add"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc4)
      "stablehlo.return"(%10) : (tensor<f32>) -> () loc(#loc4)
    }) {dimensions = array<i64: 1>} : (tensor<2x5x8xf32>, tensor<f32>) -> tensor<2x8xf32> loc(#loc4)
    %3 = "stablehlo.constant"() {value = dense<5.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc4)
    %4 = "stablehlo.optimization_barrier"(%3) : (tensor<f32>) -> tensor<f32> loc(#loc4)
    %5 = "stablehlo.broadcast_in_dim"(%4) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x8xf32> loc(#loc4)
    %6 = "stablehlo.divide"(%2, %5) : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32> loc(#loc4)
    %7 = "stablehlo.transpose"(%0) {permutation = array<i64: 2, 0, 1>} : (tensor<2x5x8xf32>) -> tensor<8x2x5xf32> loc(#loc5)
    %8 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc6)
    %9 = "stablehlo.reduce_window"(%0, %8) ({
    ^bb0(%arg2: tensor<f32> loc("cumsum"(#loc2)), %arg3: tensor<f32> loc("cumsum"(#loc2))):
      %10 = "stablehlo.add"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc6)
      "stablehlo.return"(%10) : (tensor<f32>) -> () loc(#loc6)
    }) {padding = dense<[[0, 0], [4, 0], [0, 0]]> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 5, 1>, window_strides = array<i64: 1, 1, 1>} : (tensor<2x5x8xf32>, tensor<f32>) -> tensor<2x5x8xf32> loc(#loc6)
    return %6, %7, %9 : tensor<2x8xf32>, tensor<8x2x5xf32>, tensor<2x5x8xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc1 = loc("/work/main/tools/gen_lowering.py":221:0)
#loc3 = loc("embedding"(#loc1))
#loc5 = loc("permute"(#loc2))
