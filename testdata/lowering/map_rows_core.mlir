#loc = loc(unknown)
#loc1 = loc("/work/main/tools/gen_lowering.py":344:0)
#loc5 = loc("amax"(#loc1))
module {
  func.func @main(%arg0: tensor<4x3xf32> loc(unknown), %arg1: tensor<3xf32> loc(unknown)) -> (tensor<4x3xf32>, tensor<4xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<4x3xf32>} : () -> tensor<4x3xf32> loc(#loc2)
    %1 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<4xf32>} : () -> tensor<4xf32> loc(#loc2)
    %2 = "stablehlo.constant"() {value = dense<0> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
    %3:5 = "stablehlo.while"(%2, %0, %1, %arg0, %arg1) ({
    ^bb0(%arg2: tensor<i64> loc(unknown), %arg3: tensor<4x3xf32> loc(unknown), %arg4: tensor<4xf32> loc(unknown), %arg5: tensor<4x3xf32> loc(unknown), %arg6: tensor<3xf32> loc(unknown)):
      %4 = "stablehlo.constant"() {value = dense<4> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
      %5 = "stablehlo.compare"(%arg2, %4) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i64>, tensor<i64>) -> tensor<i1> loc(#loc2)
      "stablehlo.return"(%5) : (tensor<i1>) -> () loc(#loc)
    }, {
    ^bb0(%arg2: tensor<i64> loc(unknown), %arg3: tensor<4x3xf32> loc(unknown), %arg4: tensor<4xf32> loc(unknown), %arg5: tensor<4x3xf32> loc(unknown), %arg6: tensor<3xf32> loc(unknown)):
      %4 = "stablehlo.constant"() {value = dense<0> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
      %5 = "stablehlo.dynamic_slice"(%arg5, %arg2, %4) {slice_sizes = array<i64: 1, 3>} : (tensor<4x3xf32>, tensor<i64>, tensor<i64>) -> tensor<1x3xf32> loc(#loc2)
      %6 = "stablehlo.reshape"(%5) : (tensor<1x3xf32>) -> tensor<3xf32> loc(#loc2)
      %7 = "stablehlo.multiply"(%6, %arg6) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32> loc(#loc3)
      %8 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc4)
      %9 = "stablehlo.broadcast_in_dim"(%8) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<3xf32> loc(#loc4)
      %10 = "stablehlo.add"(%7, %9) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32> loc(#loc4)
      %11 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
      %12 = "stablehlo.reduce"(%6, %11) ({
      ^bb0(%arg7: tensor<f32> loc("amax"(#loc1)), %arg8: tensor<f32> loc("amax"(#loc1))):
        %19 = "stablehlo.maximum"(%arg7, %arg8) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
        "stablehlo.return"(%19) : (tensor<f32>) -> () loc(#loc5)
      }) {dimensions = array<i64: 0>} : (tensor<3xf32>, tensor<f32>) -> tensor<f32> loc(#loc5)
      %13 = "stablehlo.constant"() {value = dense<1> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
      %14 = "stablehlo.add"(%arg2, %13) : (tensor<i64>, tensor<i64>) -> tensor<i64> loc(#loc2)
      %15 = "stablehlo.reshape"(%10) : (tensor<3xf32>) -> tensor<1x3xf32> loc(#loc2)
      %16 = "stablehlo.dynamic_update_slice"(%arg3, %15, %arg2, %4) : (tensor<4x3xf32>, tensor<1x3xf32>, tensor<i64>, tensor<i64>) -> tensor<4x3xf32> loc(#loc2)
      %17 = "stablehlo.reshape"(%12) : (tensor<f32>) -> tensor<1xf32> loc(#loc2)
      %18 = "stablehlo.dynamic_update_slice"(%arg4, %17, %arg2) : (tensor<4xf32>, tensor<1xf32>, tensor<i64>) -> tensor<4xf32> loc(#loc2)
      "stablehlo.return"(%14, %16, %18, %arg5, %arg6) : (tensor<i64>, tensor<4x3xf32>, tensor<4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> () loc(#loc)
    }) : (tensor<i64>, tensor<4x3xf32>, tensor<4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> (tensor<i64>, tensor<4x3xf32>, tensor<4xf32>, tensor<4x3xf32>, tensor<3xf32>) loc(#loc2)
    return %3#1, %3#2 : tensor<4x3xf32>, tensor<4xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc2 = loc("map_impl"(#loc1))
#loc3 = loc("mul"(#loc1))
#loc4 = loc("add"(#loc1))
