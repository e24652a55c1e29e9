#loc = loc(unknown)
#loc1 = loc("/work/main/tools/gen_lowering.py":211:0)
#loc2 = loc("/work/main/tools/gen_lowering.py":212:0)
#loc5 = loc("max_pool2d_with_indices"(#loc1))
#loc8 = loc("avg_pool2d"(#loc2))
#loc11 = loc("_adaptive_avg_pool2d"(#loc2))
module {
  func.func @main(%arg0: tensor<6x2x3xf32> loc(unknown), %arg1: tensor<6xf32> loc(unknown), %arg2: tensor<2x4x12xf32> loc(unknown)) -> (tensor<2x6x6xf32>, tensor<2x6x2xf32>) {
    %0 = "stablehlo.convolution"(%arg2, %arg0) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0]x[o, i, 0]->[b, f, 0]>, feature_group_count = 2 : i64, lhs_dilation = array<i64: 1>, padding = dense<2> : tensor<1x2xi64>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>], rhs_dilation = array<i64: 2>, window_strides = array<i64: 1>} : (tensor<2x4x12xf32>, tensor<6x2x3xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %1 = "stablehlo.broadcast_in_dim"(%arg1) {broadcast_dimensions = array<i64: 1>} : (tensor<6xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %2 = "stablehlo.add"(%0, %1) : (tensor<2x6x12xf32>, tensor<2x6x12xf32>) -> tensor<2x6x12xf32> loc(#loc3)
    %3 = "stablehlo.reshape"(%2) : (tensor<2x6x12xf32>) -> tensor<2x6x1x12xf32> loc(#loc4)
    %4 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %5 = "stablehlo.reduce_window"(%3, %4) ({
    ^bb0(%arg3: tensor<f32> loc("max_pool2d_with_indices"(#loc1)), %arg4: tensor<f32> loc("max_pool2d_with_indices"(#loc1))):
      %26 = "stablehlo.maximum"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
      "stablehlo.return"(%26) : (tensor<f32>) -> () loc(#loc5)
    }) {padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 1, 2>, window_strides = array<i64: 1, 1, 1, 2>} : (tensor<2x6x1x12xf32>, tensor<f32>) -> tensor<2x6x1x6xf32> loc(#loc5)
    %6 = "stablehlo.reshape"(%5) : (tensor<2x6x1x6xf32>) -> tensor<2x6x6xf32> loc(#loc6)
    %7 = "stablehlo.reshape"(%6) : (tensor<2x6x6xf32>) -> tensor<2x6x1x6xf32> loc(#loc7)
    %8 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc8)
    %9 = "stablehlo.reduce_window"(%7, %8) ({
    ^bb0(%arg3: tensor<f32> loc("avg_pool2d"(#loc2)), %arg4: tensor<f32> loc("avg_pool2d"(#loc2))):
      %26 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc8)
      "stablehlo.return"(%26) : (tensor<f32>) -> () loc(#loc8)
    }) {padding = dense<[[0, 0], [0, 0], [0, 0], [1, 1]]> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 1, 3>, window_strides = array<i64: 1, 1, 1, 1>} : (tensor<2x6x1x6xf32>, tensor<f32>) -> tensor<2x6x1x6xf32> loc(#loc8)
    %10 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<2x6x1x6xf32>} : () -> tensor<2x6x1x6xf32> loc(#loc8)
    %11 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc8)
    %12 = "stablehlo.pad"(%10, %11) {edge_padding_high = array<i64: 0, 0, 0, 1>, edge_padding_low = array<i64: 0, 0, 0, 1>, interior_padding = array<i64: 0, 0, 0, 0>} : (tensor<2x6x1x6xf32>, tensor<f32>) -> tensor<2x6x1x8xf32> loc(#loc8)
    %13 = "stablehlo.reduce_window"(%12, %8) ({
    ^bb0(%arg3: tensor<f32> loc("avg_pool2d"(#loc2)), %arg4: tensor<f32> loc("avg_pool2d"(#loc2))):
      %26 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc8)
      "stablehlo.return"(%26) : (tensor<f32>) -> () loc(#loc8)
    }) {padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 1, 3>, window_strides = array<i64: 1, 1, 1, 1>} : (tensor<2x6x1x8xf32>, tensor<f32>) -> tensor<2x6x1x6xf32> loc(#loc8)
    %14 = "stablehlo.divide"(%9, %13) : (tensor<2x6x1x6xf32>, tensor<2x6x1x6xf32>) -> tensor<2x6x1x6xf32> loc(#loc8)
    %15 = "stablehlo.reshape"(%14) : (tensor<2x6x1x6xf32>) -> tensor<2x6x6xf32> loc(#loc9)
    %16 = "stablehlo.reshape"(%6) : (tensor<2x6x6xf32>) -> tensor<2x6x1x6xf32> loc(#loc10)
    %17 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc11)
    %18 = "stablehlo.reduce_window"(%16, %17) ({
    ^bb0(%arg3: tensor<f32> loc("_adaptive_avg_pool2d"(#loc2)), %arg4: tensor<f32> loc("_adaptive_avg_pool2d"(#loc2))):
      %26 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc11)
      "stablehlo.return"(%26) : (tensor<f32>) -> () loc(#loc11)
    }) {padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 1, 1>, window_strides = array<i64: 1, 1, 1, 1>} : (tensor<2x6x1x6xf32>, tensor<f32>) -> tensor<2x6x1x6xf32> loc(#loc11)
    %19 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<2x6x1x6xf32>} : () -> tensor<2x6x1x6xf32> loc(#loc11)
    %20 = "stablehlo.divide"(%18, %19) : (tensor<2x6x1x6xf32>, tensor<2x6x1x6xf32>) -> tensor<2x6x1x6xf32> loc(#loc11)
    %21 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc11)
    %22 = "stablehlo.reduce_window"(%20, %21) ({
    ^bb0(%arg3: tensor<f32> loc("_adaptive_avg_pool2d"(#loc2)), %arg4: tensor<f32> loc("_adaptive_avg_pool2d"(#loc2))):
      %26 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc11)
      "stablehlo.return"(%26) : (tensor<f32>) -> () loc(#loc11)
    }) {padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 1, 1, 3>, window_strides = array<i64: 1, 1, 1, 3>} : (tensor<2x6x1x6xf32>, tensor<f32>) -> tensor<2x6x1x2xf32> loc(#loc11)
    %23 = "stablehlo.constant"() {value = dense<3.000000e+00> : tensor<2x6x1x2xf32>} : () -> tensor<2x6x1x2xf32> loc(#loc11)
    %24 = "stablehlo.divide"(%22, %23) : (tensor<2x6x1x2xf32>, tensor<2x6x1x2xf32>) -> tensor<2x6x1x2xf32> loc(#loc11)
    %25 = "stablehlo.reshape"(%24) : (tensor<2x6x1x2xf32>) -> tensor<2x6x2xf32> loc(#loc12)
    return %15, %25 : tensor<2x6x6xf32>, tensor<2x6x2xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc3 = loc("convolution"(#loc1))
#loc4 = loc("unsqueeze"(#loc1))
#loc6 = loc("squeeze"(#loc1))
#loc7 = loc("unsqueeze_1"(#loc2))
#loc9 = loc("squeeze_2"(#loc2))
#loc10 = loc("unsqueeze_2"(#loc2))
#loc12 = loc("squeeze_3"(#loc2))
