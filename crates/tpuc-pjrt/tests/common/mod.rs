//! Helpers shared by the runtime tests.
#![allow(dead_code)]
use std::sync::Arc;
use tpuc_pjrt::*;

pub fn plugin() -> Arc<Plugin> {
    let path =
        discover::resolve(Some("cpu")).expect("the CPU plugin is installed (tools/setup.sh)");
    Plugin::load(&path).expect("the CPU plugin loads")
}

pub fn client(devices: i64) -> Client {
    let options = ClientOptions {
        cpu_device_count: Some(devices),
        ..Default::default()
    };
    Client::new(&plugin(), &options).expect("client")
}

pub const ADD: &str = r#"
module {
  func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.add %a, %b : tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }
}"#;

pub fn f32s(dims: &[i64], values: &[f32]) -> HostTensor {
    HostTensor::from_slice(DType::F32, dims, values).unwrap()
}
