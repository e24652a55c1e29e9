#loc = loc(unknown)
#loc1 = loc("/work/main/tools/gen_lowering.py":211:0)
#loc2 = loc("/work/main/tools/gen_lowering.py":212:0)
#loc5 = loc("max_pool2d_with_indices"(#loc1))
#loc6 = loc("avg_pool2d"(#loc2))
#loc8 = loc("_adaptive_avg_pool2d"(#loc2))
module {
  func.func @main(%arg0: tensor<6x2x3xf32> loc(unknown), %arg1: tensor<6xf32> loc(unknown), %arg2: tensor<2x4x12xf32> loc(unknown)) -> (tensor<2x6x6xf32>, tensor<2x6x2xf32>) {
    %0 = "stablehlo.convolution"(%arg2, %arg0) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0]x[o, i, 0]->[b, f, 0]>, feature_group_count = 2 : i64, lhs_dilation = array<i64: 1>, padding = dense<2> : tensor<1x2xi64>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>], rhs_dilation = array<i64: 2>, window_strides = array<i64: 1>} : (tensor<2x4x12xf32>, tensor<6x2x3xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %1 = "stablehlo.broadcast_in_dim"(%arg1) {broadcast_dimensions = array<i64: 1>} : (tensor<6xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %2 = "stablehlo.add"(%0, %1) : (tensor<2x6x12xf32>, tensor<2x6x12xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %3 = "stablehlo.reshape"(%2) : (tensor<2x6x12xf32>) -> tensor<2x6x1x12xf32> loc(#loc4)
    %4 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %5 = "stablehlo.transpose"(%3) {permutation = array<i64: 0, 2, 3, 1>} : (tensor<2x6x1x12xf32>) -> tensor<2x1x12x6xf32> loc(#loc5)
    %6 = "stablehlo.reduce_window"(%5, %4) ({
    ^bb0(%arg3: tensor<f32> loc("max_pool2d_with_indices"(#loc1)), %arg4: tensor<f32> loc("max_pool2d_with_indices"(#loc1))):
      %27 = "stablehlo.maximum"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
      "stablehlo.return"(%27) : (tensor<f32>) -> () loc(#loc5)
    }) {padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 2, 1>, window_strides = array<i64: 1, 1, 2, 1>} : (tensor<2x1x12x6xf32>, tensor<f32>) -> tensor<2x1x6x6xf32> loc(#loc5)
    %7 = "stablehlo.transpose"(%6) {permutation = array<i64: 0, 3, 1, 2>} : (tensor<2x1x6x6xf32>) -> tensor<2x6x1x6xf32> loc(#loc5)
    %8 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc6)
    %9 = "stablehlo.reduce_window"(%6, %8) ({
    ^bb0(%arg3: tensor<f32> loc("avg_pool2d"(#loc2)), %arg4: tensor<f32> loc("avg_pool2d"(#loc2))):
      %27 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc6)
      "stablehlo.return"(%27) : (tensor<f32>) -> () loc(#loc6)
    }) {padding = dense<[[0, 0], [0, 0], [1, 1], [0, 0]]> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 3, 1>, window_strides = array<i64: 1, 1, 1, 1>} : (tensor<2x1x6x6xf32>, tensor<f32>) -> tensor<2x1x6x6xf32> loc(#loc6)
    %10 = "stablehlo.transpose"(%9) {permutation = array<i64: 0, 3, 1, 2>} : (tensor<2x1x6x6xf32>) -> tensor<2x6x1x6xf32> loc(#loc6)
    %11 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc6)
    %12 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<2x6x1x6xf32>} : () -> tensor<2x6x1x6xf32> loc(#loc6)
    %13 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc6)
    %14 = "stablehlo.pad"(%12, %13) {edge_padding_high = array<i64: 0, 0, 0, 1>, edge_padding_low = array<i64: 0, 0, 0, 1>, interior_padding = array<i64: 0, 0, 0, 0>} : (tensor<2x6x1x6xf32>, tensor<f32>) -> tensor<2x6x1x8xf32> loc(#loc6)
    %15 = "stablehlo.reduce_window"(%14, %11) ({
    ^bb0(%arg3: tensor<f32> loc("avg_pool2d"(#loc2)), %arg4: tensor<f32> loc("avg_pool2d"(#loc2))):
      %27 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc6)
      "stablehlo.return"(%27) : (tensor<f32>) -> () loc(#loc6)
    }) {padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 1, 3>, window_strides = array<i64: 1, 1, 1, 1>} : (tensor<2x6x1x8xf32>, tensor<f32>) -> tensor<2x6x1x6xf32> loc(#loc6)
    %16 = "stablehlo.divide"(%10, %15) : (tensor<2x6x1x6xf32>, tensor<2x6x1x6xf32>) -> tensor<2x6x1x6xf32> loc(#loc6)
    %17 = "stablehlo.reshape"(%16) : (tensor<2x6x1x6xf32>) -> tensor<2x6x6xf32> loc(#loc7)
    %18 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc8)
    %19 = "stablehlo.reduce_window"(%7, %18) ({
    ^bb0(%arg3: tensor<f32> loc("_adaptive_avg_pool2d"(#loc2)), %arg4: tensor<f32> loc("_adaptive_avg_pool2d"(#loc2))):
      %27 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc8)
      "stablehlo.return"(%27) : (tensor<f32>) -> () loc(#loc8)
    }) {padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 1, 1>, window_strides = array<i64: 1, 1, 1, 1>} : (tensor<2x6x1x6xf32>, tensor<f32>) -> tensor<2x6x1x6xf32> loc(#loc8)
    %20 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<2x6x1x6xf32>} : () -> tensor<2x6x1x6xf32> loc(#loc8)
    %21 = "stablehlo.divide"(%19, %20) : (tensor<2x6x1x6xf32>, tensor<2x6x1x6xf32>) -> tensor<2x6x1x6xf32> loc(#loc8)
    %22 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc8)
    %23 = "stablehlo.reduce_window"(%21, %22) ({
    ^bb0(%arg3: tensor<f32> loc("_adaptive_avg_pool2d"(#loc2)), %arg4: tensor<f32> loc("_adaptive_avg_pool2d"(#loc2))):
      %27 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc8)
      "stablehlo.return"(%27) : (tensor<f32>) -> () loc(#loc8)
    }) {padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 1, 3>, window_strides = array<i64: 1, 1, 1, 3>} : (tensor<2x6x1x6xf32>, tensor<f32>) -> tensor<2x6x1x2xf32> loc(#loc8)
    %24 = "stablehlo.constant"() {value = dense<3.000000e+00> : tensor<2x6x1x2xf32>} : () -> tensor<2x6x1x2xf32> loc(#loc8)
    %25 = "stablehlo.divide"(%23, %24) : (tensor<2x6x1x2xf32>, tensor<2x6x1x2xf32>) -> tensor<2x6x1x2xf32> loc(#loc8)
    %26 = "stablehlo.reshape"(%25) : (tensor<2x6x1x2xf32>) -> tensor<2x6x2xf32> loc(#loc9)
    return %17, %26 : tensor<2x6x6xf32>, tensor<2x6x2xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc3 = loc("convolution"(#loc1))
#loc4 = loc("unsqueeze"(#loc1))
#loc7 = loc("squeeze_2"(#loc2))
#loc9 = loc("squeeze_3"(#loc2))
