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
    %4 = "stablehlo.reduce_window"(%2, %3) ({
    ^bb0(%arg3: tensor<f32> loc("max_pool1d"(#loc1)), %arg4: tensor<f32> loc("max_pool1d"(#loc1))):
      %17 = "stablehlo.maximum"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc4)
      "stablehlo.return"(%17) : (tensor<f32>) -> () loc(#loc4)
    }) {padding = dense<0> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 1, 2>, window_strides = array<i64: 1, 1, 2>} : (tensor<2x6x12xf32>, tensor<f32>) -> tensor<2x6x6xf32> loc(#loc4)
    %5 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %6 = "stablehlo.reduce_window"(%4, %5) ({
    ^bb0(%arg3: tensor<f32> loc("avg_pool1d"(#loc2)), %arg4: tensor<f32> loc("avg_pool1d"(#loc2))):
      %17 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
      "stablehlo.return"(%17) : (tensor<f32>) -> () loc(#loc5)
    }) {padding = dense<[[0, 0], [0, 0], [1, 1]]> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 1, 3>, window_strides = array<i64: 1, 1, 1>} : (tensor<2x6x6xf32>, tensor<f32>) -> tensor<2x6x6xf32> loc(#loc5)
    %7 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %8 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<2x6x6xf32>} : () -> tensor<2x6x6xf32> loc(#loc5)
    %9 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %10 = "stablehlo.pad"(%8, %9) {edge_padding_high = array<i64: 0, 0, 1>, edge_padding_low = array<i64: 0, 0, 1>, interior_padding = array<i64: 0, 0, 0>} : (tensor<2x6x6xf32>, tensor<f32>) -> tensor<2x6x8xf32> loc(#loc5)
    %11 = "stablehlo.reduce_window"(%10, %7) ({
    ^bb0(%arg3: tensor<f32> loc("avg_pool1d"(#loc2)), %arg4: tensor<f32> loc("avg_pool1d"(#loc2))):
      %17 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
      "stablehlo.return"(%17) : (tensor<f32>) -> () loc(#loc5)
    }) {padding = dense<0> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 1, 3>, window_strides = array<i64: 1, 1, 1>} : (tensor<2x6x8xf32>, tensor<f32>) -> tensor<2x6x6xf32> loc(#loc5)
    %12 = "stablehlo.divide"(%6, %11) : (tensor<2x6x6xf32>, tensor<2x6x6xf32>) -> tensor<2x6x6xf32> loc(#loc5)
    %13 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc6)
    %14 = "stablehlo.reduce_window"(%4, %13) ({
    ^bb0(%arg3: tensor<f32> loc("adaptive_avg_pool1d"(#loc2)), %arg4: tensor<f32> loc("adaptive_avg_pool1d"(#loc2))):
      %17 = "stablehlo.add"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc6)
      "stablehlo.return"(%17) : (tensor<f32>) -> () loc(#loc6)
    }) {padding = dense<0> : tensor<3x2xi64>, window_dimensions = array<i64: 1, 1, 3>, window_strides = array<i64: 1, 1, 3>} : (tensor<2x6x6xf32>, tensor<f32>) -> tensor<2x6x2xf32> loc(#loc6)
    %15 = "stablehlo.constant"() {value = dense<3.000000e+00> : tensor<2x6x2xf32>} : () -> tensor<2x6x2xf32> loc(#loc6)
    %16 = "stablehlo.divide"(%14, %15) : (tensor<2x6x2xf32>, tensor<2x6x2xf32>) -> tensor<2x6x2xf32> loc(#loc6)
    return %12, %16 : tensor<2x6x6xf32>, tensor<2x6x2xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc3 = loc("conv1d"(#loc1))
