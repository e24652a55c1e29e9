#loc = loc(unknown)
#loc1 = loc("/work/main/tools/gen_lowering.py":344:0)
#loc5 = loc("amax"(#loc1))
module {
  func.func @main(%arg0: tensor<4x3xf32> loc(unknown), %arg1: tensor<3xf32> loc(unknown)) -> (tensor<4x3xf32>, tensor<4xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<4x3xf32>} : () -> tensor<4x3xf32> loc(#loc2)
    %1 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<4xf32>} : () -> tensor<4xf32> loc(#loc2)
    %2 = "stablehlo.constant"() {value = dense<4> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
    %3 = "stablehlo.constant"() {value = dense<0> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
    %4:6 = "stablehlo.while"(%3, %2, %0, %1, %arg0, %arg1) ({
    ^bb0(%arg2: tensor<i64> loc(unknown), %arg3: tensor<i64> loc(unknown), %arg4: tensor<4x3xf32> loc(unknown), %arg5: tensor<4xf32> loc(unknown), %arg6: tensor<4x3xf32> loc(unknown), %arg7: tensor<3xf32> loc(unknown)):
      %5 = "stablehlo.compare"(%arg2, %arg3) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i64>, tensor<i64>) -> tensor<i1> loc(#loc2)
      "stablehlo.return"(%5) : (tensor<i1>) -> () loc(#loc)
    }, {
    ^bb0(%arg2: tensor<i64> loc(unknown), %arg3: tensor<i64> loc(unknown), %arg4: tensor<4x3xf32> loc(unknown), %arg5: tensor<4xf32> loc(unknown), %arg6: tensor<4x3xf32> loc(unknown), %arg7: tensor<3xf32> loc(unknown)):
      %5 = "stablehlo.constant"() {value = dense<0> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
      %6 = "stablehlo.dynamic_slice"(%arg6, %arg2, %5) {slice_sizes = array<i64: 1, 3>} : (tensor<4x3xf32>, tensor<i64>, tensor<i64>) -> tensor<1x3xf32> loc(#loc2)
      %7 = "stablehlo.reshape"(%6) : (tensor<1x3xf32>) -> tensor<3xf32> loc(#loc2)
      %8 = "stablehlo.multiply"(%7, %arg7) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32> loc(#loc3)
      %9 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc4)
      %10 = "stablehlo.broadcast_in_dim"(%9) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<3xf32> loc(#loc4)
      %11 = "stablehlo.add"(%8, %10) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32> loc(#loc4)
      %12 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
      %13 = "stablehlo.reduce"(%7, %12) ({
      ^bb0(%arg8: tensor<f32> loc("amax"(#loc1)), %arg9: tensor<f32> loc("amax"(#loc1))):
        %21 = "stablehlo.maximum"(%arg8, %arg9) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
        "stablehlo.return"(%21) : (tensor<f32>) -> () loc(#loc5)
      }) {dimensions = array<i64: 0>} : (tensor<3xf32>, tensor<f32>) -> tensor<f32> loc(#loc5)
      %14 = "stablehlo.constant"() {value = dense<0> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
      %15 = "stablehlo.reshape"(%11) : (tensor<3xf32>) -> tensor<1x3xf32> loc(#loc2)
      %16 = "stablehlo.dynamic_update_slice"(%arg4, %15, %arg2, %14) : (tensor<4x3xf32>, tensor<1x3xf32>, tensor<i64>, tensor<i64>) -> tensor<4x3xf32> loc(#loc2)
      %17 = "stablehlo.reshape"(%13) : (tensor<f32>) -> tensor<1xf32> loc(#loc2)
      %18 = "stablehlo.dynamic_update_slice"(%arg5, %17, %arg2) : (tensor<4xf32>, tensor<1xf32>, tensor<i64>) -> tensor<4xf32> loc(#loc2)
      %19 = "stablehlo.constant"() {value = dense<1> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
      %20 = "stablehlo.add"(%arg2, %19) : (tensor<i64>, tensor<i64>) -> tensor<i64> loc(#loc2)
      "stablehlo.return"(%20, %arg3, %16, %18, %arg6, %arg7) : (tensor<i64>, tensor<i64>, tensor<4x3xf32>, tensor<4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> () loc(#loc)
    }) : (tensor<i64>, tensor<i64>, tensor<4x3xf32>, tensor<4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> (tensor<i64>, tensor<i64>, tensor<4x3xf32>, tensor<4xf32>, tensor<4x3xf32>, tensor<3xf32>) loc(#loc2)
    return %4#2, %4#3 : tensor<4x3xf32>, tensor<4xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc2 = loc("map_impl"(#loc1))
#loc3 = loc("mul"(#loc1))
#loc4 = loc("add"(#loc1))
