#loc = loc(unknown)
#loc1 = loc("/work/main/tools/gen_lowering.py":211:0)
#loc2 = loc("/work/main/tools/gen_lowering.py":212:0)
#loc4 = loc("max_pool1d"(#loc1))
#loc5 = loc("avg_pool1d"(#loc2))
#loc6 = loc("adaptive_avg_pool1d"(#loc2))
module {
  func.func @main(%arg0: tensor<6x2x3xf32> loc(unknown), %arg1: tensor<6xf32> loc(unknown), %arg2: tensor<2x4x12xf32> loc(unknown)) -> (tensor<2x6x6xf32>, tensor<2x6x2xf32>) {
    %0 = "stablehlo.convolution"(%arg2, %arg0) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0]x[o, i, 0]->[b, f, 0]>, feature_group_count = 2 : i64, lhs_dilation = array<i64: 1>, padding = dense<2> : tensor<1x2xi64>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>], rhs_dilation = array<i64: 2>, window_strides = array<i64: 1>} : (tensor<2x4x12xf32>, tensor<6x2x3xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %1 = "stablehlo.broadcast_in_dim"(%arg1) {broadcast_dimensions = array<i64: 1>} : (tensor<6xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %2 = "stablehlo.add"(%0, %1) : (tensor<2x6x12xf32>, tensor<2x6x12xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %3 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32> loc(#loc4)
    %4 = "stablehlo.transpose"(%2) {permutation = array<i64: 0, 2, 1>} : (tensor<2x6x12xf32>) -> tensor<2x12x6xf32> loc(#loc4)
    %5 = "stablehlo.reduce_window"(%4, %3) ({
    ^bb0(%arg3: tensor<f32> loc("max_pool1d"(#loc1)), %arg4: tensor<f32> loc("max_pool1d"(#loc1))):
      %22 = "stablehlo.maximum"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc4)
      "stablehlo.return"(%22) : (tensor<f32>) -> () loc(#loc4)
    }) {padding = dense<0> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 2, 1>, window_strides = array<i64: 1, 2, 1>} : (tensor<2x12x6xf32>, tensor<f32>) -> tensor<2x6x6xf32> loc(#loc4)
    %6 = "stablehlo.transpose"(%5) {permutation = array<i64: 0, 2, 1>} : (tensor<2x6x6xf32>) -> tensor<2x6x6xf32> loc(#loc4)
    %7 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %8 = "stablehlo.reduce_window"(%5, %7) ({
    ^bb0(%arg3: tensor<f32> loc("avg_pool1d"(#loc2)), %arg4: tensor<f32> loc("avg_pool1d"(#loc2))):
      %22 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
      "stablehlo.return"(%22) : (tensor<f32>) -> () loc(#loc5)
    }) {padding = dense<[[0, 0], [1, 1], [0, 0]]> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 3, 1>, window_strides = array<i64: 1, 1, 1>} : (tensor<2x6x6xf32>, tensor<f32>) -> tensor<2x6x6xf32> loc(#loc5)
    %9 = "stablehlo.transpose"(%8) {permutation = array<i64: 0, 2, 1>} : (tensor<2x6x6xf32>) -> tensor<2x6x6xf32> loc(#loc5)
    %10 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %11 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<2x6x6xf32>} : () -> tensor<2x6x6xf32> loc(#loc5)
    %12 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %13 = "stablehlo.pad"(%11, %12) {edge_padding_high = array<i64: 0, 0, 1>, edge_padding_low = array<i64: 0, 0, 1>, interior_padding = array<i64: 0, 0, 0>} : (tensor<2x6x6xf32>, tensor<f32>) -> tensor<2x6x8xf32> loc(#loc5)
    %14 = "stablehlo.reduce_window"(%13, %10) ({
    ^bb0(%arg3: tensor<f32> loc("avg_pool1d"(#loc2)), %arg4: tensor<f32> loc("avg_pool1d"(#loc2))):
      %22 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
      "stablehlo.return"(%22) : (tensor<f32>) -> () loc(#loc5)
    }) {padding = dense<0> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 1, 3>, window_strides = array<i64: 1, 1, 1>} : (tensor<2x6x8xf32>, tensor<f32>) -> tensor<2x6x6xf32> loc(#loc5)
    %15 = "stablehlo.divide"(%9, %14) : (tensor<2x6x6xf32>, tensor<2x6x6xf32>) -> tensor<2x6x6xf32> loc(#loc5)
    %16 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc6)
    %17 = "stablehlo.reduce_window"(%6, %16) ({
    ^bb0(%arg3: tensor<f32> loc("adaptive_avg_pool1d"(#loc2)), %arg4: tensor<f32> loc("adaptive_avg_pool1d"(#loc2))):
      %22 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc6)
      "stablehlo.return"(%22) : (tensor<f32>) -> () loc(#loc6)
    }) {padding = dense<0> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 1, 3>, window_strides = array<i64: 1, 1, 3>} : (tensor<2x6x6xf32>, tensor<f32>) -> tensor<2x6x2xf32> loc(#loc6)
    %18 = "stablehlo.constant"() {value = dense<3.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc6)
    %19 = "stablehlo.optimization_barrier"(%18) : (tensor<f32>) -> tensor<f32> loc(#loc6)
    %20 = "stablehlo.broadcast_in_dim"(%19) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x6x2xf32> loc(#loc6)
    %21 = "stablehlo.divide"(%17, %20) : (tensor<2x6x2xf32>, tensor<2x6x2xf32>) -> tensor<2x6x2xf32> loc(#loc6)
    return %15, %21 : tensor<2x6x6xf32>, tensor<2x6x2xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc3 = loc("conv1d"(#loc1))
