#loc = loc(unknown)
#loc1 = loc("/work/main/tools/gen_lowering.py":314:0)
#loc4 = loc("sum_1"(#loc1))
module {
  func.func @main(%arg0: tensor<2x3xf32> loc(unknown), %arg1: tensor<i64> loc(unknown)) -> (tensor<i64>, tensor<2x3xf32>, tensor<f32>) {
    %0 = "stablehlo.constant"() {value = dense<0> : tensor<i64>} : () -> tensor<i64> loc(#loc2)
    %1 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<2x3xf32>} : () -> tensor<2x3xf32> loc(#loc3)
    %2 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc4)
    %3 = "stablehlo.reduce"(%arg0, %2) ({
    ^bb0(%arg2: tensor<f32> loc("sum_1"(#loc1)), %arg3: tensor<f32> loc("sum_1"(#loc1))):
      %7 = "stablehlo.add"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc4)
      "stablehlo.return"(%7) : (tensor<f32>) -> () loc(#loc4)
    }) {dimensions = array<i64: 0, 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32> loc(#loc4)
    %4 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
    %5 = "stablehlo.multiply"(%3, %4) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc5)
    %6:5 = "stablehlo.while"(%0, %1, %5, %arg1, %arg0) ({
    ^bb0(%arg2: tensor<i64> loc(unknown), %arg3: tensor<2x3xf32> loc(unknown), %arg4: tensor<f32> loc(unknown), %arg5: tensor<i64> loc(unknown), %arg6: tensor<2x3xf32> loc(unknown)):
      %7 = "stablehlo.compare"(%arg2, %arg5) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i64>, tensor<i64>) -> tensor<i1> loc(#loc7)
      "stablehlo.return"(%7) : (tensor<i1>) -> () loc(#loc)
    }, {
    ^bb0(%arg2: tensor<i64> loc(unknown), %arg3: tensor<2x3xf32> loc(unknown), %arg4: tensor<f32> loc(unknown), %arg5: tensor<i64> loc(unknown), %arg6: tensor<2x3xf32> loc(unknown)):
      %7 = "stablehlo.constant"() {value = dense<5.000000e-01> : tensor<f32>} : () -> tensor<f32> loc(#loc5)
      %8 = "stablehlo.broadcast_in_dim"(%7) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x3xf32> loc(#loc5)
      %9 = "stablehlo.multiply"(%arg3, %8) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32> loc(#loc5)
      %10 = "stablehlo.add"(%9, %arg6) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32> loc(#loc8)
      %11 = "stablehlo.constant"() {value = dense<1> : tensor<i64>} : () -> tensor<i64> loc(#loc9)
      %12 = "stablehlo.add"(%arg2, %11) : (tensor<i64>, tensor<i64>) -> tensor<i64> loc(#loc9)
      %13 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc4)
      %14 = "stablehlo.reduce"(%10, %13) ({
      ^bb0(%arg7: tensor<f32> loc("sum_1"(#loc1)), %arg8: tensor<f32> loc("sum_1"(#loc1))):
        %16 = "stablehlo.add"(%arg7, %arg8) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc4)
        "stablehlo.return"(%16) : (tensor<f32>) -> () loc(#loc4)
      }) {dimensions = array<i64: 0, 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32> loc(#loc4)
      %15 = "stablehlo.add"(%arg4, %14) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc10)
      "stablehlo.return"(%12, %10, %15, %arg5, %arg6) : (tensor<i64>, tensor<2x3xf32>, tensor<f32>, tensor<i64>, tensor<2x3xf32>) -> () loc(#loc)
    }) : (tensor<i64>, tensor<2x3xf32>, tensor<f32>, tensor<i64>, tensor<2x3xf32>) -> (tensor<i64>, tensor<2x3xf32>, tensor<f32>, tensor<i64>, tensor<2x3xf32>) loc(#loc6)
    return %6#0, %6#1, %6#2 : tensor<i64>, tensor<2x3xf32>, tensor<f32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc2 = loc("full"(#loc1))
#loc3 = loc("full_like"(#loc1))
#loc5 = loc("mul"(#loc1))
#loc6 = loc("while_loop"(#loc1))
#loc7 = loc("lt"(#loc1))
#loc8 = loc("add"(#loc1))
#loc9 = loc("add_1"(#loc1))
#loc10 = loc("add_2"(#loc1))
