#loc = loc(unknown)
#loc1 = loc("/work/main/tools/gen_lowering.py":295:0)
#loc2 = loc("/work/main/tools/gen_lowering.py":296:0)
#loc3 = loc("sum_1"(#loc1))
#loc7 = loc("amax"(#loc1))
#loc11 = loc("sum_2"(#loc2))
#loc15 = loc("amax"(#loc2))
#loc19 = loc("sum_1"(#loc2))
module {
  func.func @main(%arg0: tensor<4x4xf32> loc(unknown), %arg1: tensor<3x4xf32> loc(unknown)) -> (tensor<3x4xf32>, tensor<4xf32>, tensor<3x4xf32>, tensor<4xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc3)
    %1 = "stablehlo.reduce"(%arg1, %0) ({
    ^bb0(%arg2: tensor<f32> loc("sum_1"(#loc1)), %arg3: tensor<f32> loc("sum_1"(#loc1))):
      %12 = "stablehlo.add"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc3)
      "stablehlo.return"(%12) : (tensor<f32>) -> () loc(#loc3)
    }) {dimensions = array<i64: 0, 1>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<f32> loc(#loc3)
    %2 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc4)
    %3 = "stablehlo.compare"(%1, %2) {compare_type = #stablehlo<comparison_type FLOAT>, comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<f32>, tensor<f32>) -> tensor<i1> loc(#loc4)
    %4 = "stablehlo.convert"(%3) : (tensor<i1>) -> tensor<i32> loc(#loc5)
    %5:2 = "stablehlo.case"(%4) ({
      %12 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc6)
      %13 = "stablehlo.broadcast_in_dim"(%12) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<3x4xf32> loc(#loc6)
      %14 = "stablehlo.subtract"(%arg1, %13) : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32> loc(#loc6)
      %15 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32> loc(#loc7)
      %16 = "stablehlo.reduce"(%arg1, %15) ({
      ^bb0(%arg2: tensor<f32> loc("amax"(#loc1)), %arg3: tensor<f32> loc("amax"(#loc1))):
        %20 = "stablehlo.maximum"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc7)
        "stablehlo.return"(%20) : (tensor<f32>) -> () loc(#loc7)
      }) {dimensions = array<i64: 0>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<4xf32> loc(#loc7)
      %17 = "stablehlo.slice"(%arg0) {limit_indices = array<i64: 1, 4>, start_indices = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<4x4xf32>) -> tensor<1x4xf32> loc(#loc8)
      %18 = "stablehlo.reshape"(%17) : (tensor<1x4xf32>) -> tensor<4xf32> loc(#loc8)
      %19 = "stablehlo.multiply"(%16, %18) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> loc(#loc9)
      "stablehlo.return"(%14, %19) : (tensor<3x4xf32>, tensor<4xf32>) -> () loc(#loc)
    }, {
      %12 = "stablehlo.dot_general"(%arg1, %arg0) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<3x4xf32>, tensor<4x4xf32>) -> tensor<3x4xf32> loc(#loc10)
      %13 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc3)
      %14 = "stablehlo.reduce"(%arg1, %13) ({
      ^bb0(%arg2: tensor<f32> loc("sum_1"(#loc1)), %arg3: tensor<f32> loc("sum_1"(#loc1))):
        %15 = "stablehlo.add"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc3)
        "stablehlo.return"(%15) : (tensor<f32>) -> () loc(#loc3)
      }) {dimensions = array<i64: 0>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<4xf32> loc(#loc3)
      "stablehlo.return"(%12, %14) : (tensor<3x4xf32>, tensor<4xf32>) -> () loc(#loc)
    }) : (tensor<i32>) -> (tensor<3x4xf32>, tensor<4xf32>) loc(#loc5)
    %6 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc11)
    %7 = "stablehlo.reduce"(%arg1, %6) ({
    ^bb0(%arg2: tensor<f32> loc("sum_2"(#loc2)), %arg3: tensor<f32> loc("sum_2"(#loc2))):
      %12 = "stablehlo.add"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc11)
      "stablehlo.return"(%12) : (tensor<f32>) -> () loc(#loc11)
    }) {dimensions = array<i64: 0, 1>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<f32> loc(#loc11)
    %8 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc12)
    %9 = "stablehlo.compare"(%7, %8) {compare_type = #stablehlo<comparison_type FLOAT>, comparison_direction = #stablehlo<comparison_direction LE>} : (tensor<f32>, tensor<f32>) -> tensor<i1> loc(#loc12)
    %10 = "stablehlo.convert"(%9) : (tensor<i1>) -> tensor<i32> loc(#loc13)
    %11:2 = "stablehlo.case"(%10) ({
      %12 = "stablehlo.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc14)
      %13 = "stablehlo.broadcast_in_dim"(%12) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<3x4xf32> loc(#loc14)
      %14 = "stablehlo.subtract"(%arg1, %13) : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32> loc(#loc14)
      %15 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32> loc(#loc15)
      %16 = "stablehlo.reduce"(%arg1, %15) ({
      ^bb0(%arg2: tensor<f32> loc("amax"(#loc2)), %arg3: tensor<f32> loc("amax"(#loc2))):
        %20 = "stablehlo.maximum"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc15)
        "stablehlo.return"(%20) : (tensor<f32>) -> () loc(#loc15)
      }) {dimensions = array<i64: 0>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<4xf32> loc(#loc15)
      %17 = "stablehlo.slice"(%arg0) {limit_indices = array<i64: 1, 4>, start_indices = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<4x4xf32>) -> tensor<1x4xf32> loc(#loc16)
      %18 = "stablehlo.reshape"(%17) : (tensor<1x4xf32>) -> tensor<4xf32> loc(#loc16)
      %19 = "stablehlo.multiply"(%16, %18) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> loc(#loc17)
      "stablehlo.return"(%14, %19) : (tensor<3x4xf32>, tensor<4xf32>) -> () loc(#loc)
    }, {
      %12 = "stablehlo.dot_general"(%arg1, %arg0) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<3x4xf32>, tensor<4x4xf32>) -> tensor<3x4xf32> loc(#loc18)
      %13 = "stablehlo.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32> loc(#loc19)
      %14 = "stablehlo.reduce"(%arg1, %13) ({
      ^bb0(%arg2: tensor<f32> loc("sum_1"(#loc2)), %arg3: tensor<f32> loc("sum_1"(#loc2))):
        %15 = "stablehlo.add"(%arg2, %arg3) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc(#loc19)
        "stablehlo.return"(%15) : (tensor<f32>) -> () loc(#loc19)
      }) {dimensions = array<i64: 0>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<4xf32> loc(#loc19)
      "stablehlo.return"(%12, %14) : (tensor<3x4xf32>, tensor<4xf32>) -> () loc(#loc)
    }) : (tensor<i32>) -> (tensor<3x4xf32>, tensor<4xf32>) loc(#loc13)
    return %5#0, %5#1, %11#0, %11#1 : tensor<3x4xf32>, tensor<4xf32>, tensor<3x4xf32>, tensor<4xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc4 = loc("gt"(#loc1))
#loc5 = loc("cond"(#loc1))
#loc6 = loc("sub"(#loc1))
#loc8 = loc("select"(#loc1))
#loc9 = loc("mul"(#loc1))
#loc10 = loc("matmul"(#loc1))
#loc12 = loc("le"(#loc2))
#loc13 = loc("cond_1"(#loc2))
#loc14 = loc("sub"(#loc2))
#loc16 = loc("select"(#loc2))
#loc17 = loc("mul"(#loc2))
#loc18 = loc("matmul"(#loc2))
